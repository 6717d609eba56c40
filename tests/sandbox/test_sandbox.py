"""The sandbox backends, for real: bubblewrap and a Docker engine on this machine.

Docker tests skip when no engine or image is there, unless TEXTGYM_REQUIRE_DOCKER=1
(set by .ci/run, which starts the engine and builds the image), where they must run.
"""

from __future__ import annotations

import os
import shutil
import time
import uuid

import pytest
from nonroot import nobody_process_backend

from textgym import sandbox
from textgym.sandbox import ExecRequest, SandboxUnavailableError, get_backend
from textgym.sandbox.process import ProcessBackend

REQUIRE_DOCKER = os.environ.get("TEXTGYM_REQUIRE_DOCKER") == "1"


def _backend_or_skip(name: str):
    try:
        return get_backend(name)
    except SandboxUnavailableError as e:
        if name == "docker" and not REQUIRE_DOCKER:
            pytest.skip(f"docker backend unavailable: {e}")
        raise


@pytest.fixture(scope="module", params=["process", "docker", "process-nonroot"])
def backend(request):
    """Each backend; `process-nonroot` is the process backend driven by uid 65534, as a user who is
    not root runs textgym (bubblewrap then runs as that user: no host uid of its own)."""
    if request.param == "process-nonroot":
        yield nobody_process_backend()
        return
    b = _backend_or_skip(request.param)
    yield b


@pytest.fixture(scope="module", autouse=True)
def _close_backends():
    yield
    sandbox.close_all()


def _host_pids_with(marker: str) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    if marker.encode() in f.read():
                        pids.append(int(entry))
            except OSError:
                pass
    return pids


@pytest.mark.sandbox
def test_runs_code_with_files_stdin_and_an_unprivileged_uid(backend):
    code = (
        "import os, sys\n"
        "print(os.getuid(), os.getgid(), os.getcwd())\n"
        "print(open('data/in.txt').read())\n"
        "print(sys.stdin.read().upper())\n"
        "sys.exit(3)\n"
    )
    r = backend.run(code=code, files={"data/in.txt": "hello file"}, stdin="piped")
    assert r.exit_code == 3 and not r.timed_out and not r.oom
    assert r.stdout.splitlines() == ["65534 65534 /work", "hello file", "PIPED"]
    assert r.backend == backend.name and r.duration_s > 0


@pytest.mark.sandbox
def test_no_network_readonly_system_no_host_files_clean_env(backend):
    os.environ["TEXTGYM_SECRET_TEST"] = "s3cret"
    code = (
        "import os, socket\n"
        "try:\n"
        "    socket.create_connection(('127.0.0.1', 22), timeout=2); print('net: yes')\n"
        "except OSError as e:\n"
        "    print('net:', e.errno)\n"
        "try:\n"
        "    open('/usr/evil', 'w'); print('write: yes')\n"
        "except OSError as e:\n"
        "    print('write:', e.errno)\n"
        f"print('repo:', os.path.exists({os.getcwd()!r}), 'root:', os.access('/root', os.R_OK))\n"
        "print('secret:', os.environ.get('TEXTGYM_SECRET_TEST'))\n"
        "print('pids:', len([p for p in os.listdir('/proc') if p.isdigit()]))\n"
    )
    out = backend.run(code=code).stdout.splitlines()
    assert out[0] in (
        "net: 101",
        "net: 111",
        "net: 99",
    )  # unreachable / refused / no address: nothing listens
    assert out[0] != "net: yes"
    assert out[1] in ("write: 30", "write: 13")  # read-only file system / permission denied
    assert out[2] == "repo: False root: False"
    assert out[3] == "secret: None"
    assert int(out[4].split()[1]) <= 6  # its own pid namespace: a handful of processes, not the host's


@pytest.mark.sandbox
def test_wall_clock_timeout_kills_the_whole_process_tree(backend):
    marker = f"textgym-orphan-{uuid.uuid4().hex}"
    code = (
        "import os, subprocess, sys, time\n"
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)', "
        f"'{marker}'], start_new_session=True)\n"
        "print('started', flush=True)\n"
        "time.sleep(120)\n"
    )
    t0 = time.monotonic()
    r = backend.run(code=code, timeout_s=1.5)
    assert r.timed_out and r.exit_code < 0 and not r.oom
    assert r.stdout == "started\n"
    assert 1.4 < r.duration_s < 6 and time.monotonic() - t0 < 20
    deadline = time.monotonic() + 5
    while _host_pids_with(marker) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _host_pids_with(marker) == []


@pytest.mark.sandbox
def test_daemon_left_behind_by_a_finished_run_is_killed(backend):
    marker = f"textgym-daemon-{uuid.uuid4().hex}"
    code = (
        "import subprocess, sys\n"
        f"subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)', '{marker}'], "
        "start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\n"
        "print('bye')\n"
    )
    r = backend.run(code=code)
    assert r.exit_code == 0 and r.stdout == "bye\n"
    deadline = time.monotonic() + 5
    while _host_pids_with(marker) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _host_pids_with(marker) == []


@pytest.mark.sandbox
def test_memory_limit_is_reported_as_oom(backend):
    r = backend.run(code="x = bytearray(600 * 1024 * 1024)\nprint('allocated')", memory_mb=256)
    assert r.oom and r.exit_code != 0 and "allocated" not in r.stdout
    ok = backend.run(code="x = bytearray(50 * 1024 * 1024)\nprint('allocated')", memory_mb=256)
    assert ok.ok and ok.stdout == "allocated\n" and not ok.oom


@pytest.mark.sandbox
def test_output_is_capped_and_flagged(backend):
    r = backend.run(code="import sys\nprint('a' * 300000)\nsys.stderr.write('b' * 10)", max_output_bytes=1000)
    assert r.exit_code == 0 and r.stdout == "a" * 1000 and r.stdout_truncated and r.truncated
    assert r.stderr == "b" * 10 and not r.stderr_truncated


@pytest.mark.sandbox
def test_fork_bomb_and_file_size_are_bounded(backend):
    bomb = (
        "import os\n"
        "n = 0\n"
        "try:\n"
        "    for _ in range(500):\n"
        "        if os.fork() == 0:\n"
        "            import time; time.sleep(30); os._exit(0)\n"
        "        n += 1\n"
        "except OSError as e:\n"
        "    print('fork refused after', n, e.errno)\n"
    )
    r = backend.run(code=bomb, max_processes=20, timeout_s=5)
    assert "fork refused after" in r.stdout and int(r.stdout.split()[3]) < 20
    big = backend.run(code="open('f', 'wb').write(b'x' * 2_000_000)", max_file_bytes=1_000_000)
    assert big.exit_code != 0 and ("File too large" in big.stderr or big.exit_code == -25)


@pytest.mark.sandbox
def test_each_run_starts_from_a_fresh_work_dir(backend):
    first = backend.run(code="open('left.txt', 'w').write('x'); open('/tmp/t.txt', 'w').write('y')")
    assert first.ok
    second = backend.run(code="import os; print(sorted(os.listdir('.')), os.listdir('/tmp'))")
    assert second.stdout == "['main.py'] []\n"


@pytest.mark.sandbox
def test_batch_keeps_order_and_runs_in_parallel(backend):
    """Each run reports when it slept (the host's clock: sandboxes share it); runs that were in
    flight at once overlap, and never more than `max_workers` of them (no wall-time bound: the
    machine may be loaded)."""
    code = "import time; t = time.time(); time.sleep(1.0); print({i}, t, time.time())"
    results = backend.run_batch([ExecRequest(files={"main.py": code.format(i=i)}) for i in range(8)])
    rows = [r.stdout.split() for r in results]
    assert [int(row[0]) for row in rows] == list(range(8))
    spans = [(float(row[1]), float(row[2])) for row in rows]
    peak = max(sum(1 for s, e in spans if s <= t < e) for t, _ in spans)
    assert 2 <= peak <= backend.max_workers


@pytest.mark.sandbox
@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({}, "give the code"),
        ({"files": {"/etc/x": "1"}}, "relative paths"),
        ({"files": {"../x": "1"}}, "relative paths"),
        ({"code": "1", "timeout_s": 0}, "timeout_s"),
        ({"code": "1", "memory_mb": -1}, "memory_mb"),
        ({"code": "1", "cmd": []}, "cmd"),
    ],
)
def test_malformed_requests_are_rejected_by_name(kwargs, match):
    with pytest.raises(ValueError, match=match):
        get_backend("process").run(**kwargs)


def test_missing_bubblewrap_is_a_clear_error_not_an_unsandboxed_run(monkeypatch):
    monkeypatch.setattr(shutil, "which", lambda name: None)
    with pytest.raises(SandboxUnavailableError, match="apt-get install bubblewrap"):
        ProcessBackend()


def test_unknown_backend_and_unsafe_local_warns():
    with pytest.raises(ValueError, match="unknown sandbox backend 'nope'"):
        get_backend("nope")
    with pytest.warns(UserWarning, match="WITHOUT isolation"):
        local = sandbox.UnsafeLocalBackend()
    r = local.run(code="print(6 * 7)")
    assert r.stdout == "42\n" and r.backend == "unsafe_local"


@pytest.mark.sandbox
@pytest.mark.skipif(os.geteuid() != 0, reason="host uid dropping applies when textgym runs as root")
def test_process_backend_runs_as_an_unprivileged_host_uid():
    marker = f"textgym-uid-{uuid.uuid4().hex}"
    b = get_backend("process")
    assert b.drop_host_uid
    import threading

    t = threading.Thread(
        target=b.run,
        kwargs={"code": f"import time; time.sleep(2) # {marker}", "cmd": ["python3", "main.py", marker]},
    )
    t.start()
    deadline = time.monotonic() + 5
    pids: list[int] = []
    while not pids and time.monotonic() < deadline:
        pids = _host_pids_with(marker)
        time.sleep(0.05)
    uids = set()
    for pid in pids:
        with open(f"/proc/{pid}/status") as f:
            uids |= {int(line.split()[1]) for line in f if line.startswith("Uid:")}
    t.join()
    assert pids and 0 not in uids and min(uids) >= 0x70000000


@pytest.mark.sandbox
def test_docker_pool_reuses_containers_and_replaces_none_on_success():
    b = _backend_or_skip("docker")
    b.warm(1)
    before = set(b._all)
    for _ in range(3):
        assert b.run(code="print(1)").ok
    assert set(b._all) == before  # sequential runs reuse the warm containers, none started
    r = b.run(code="import time; time.sleep(10)", timeout_s=1)
    assert r.timed_out
    assert b.run(code="print(2)").stdout == "2\n"  # the pool still serves after a timeout


@pytest.mark.sandbox
def test_check_backends_reports_process_working():
    rows = {name: (ok, why) for name, ok, why in sandbox.check_backends()}
    assert rows["process"][0], rows["process"][1]
    assert "bubblewrap" in rows["process"][1]
    assert rows["unsafe_local"][0] is False
    if REQUIRE_DOCKER:
        assert rows["docker"][0], rows["docker"][1]


REPORT_CHANNEL_PROBE = r"""
import ctypes, os, subprocess, sys
fd = int(os.environ["TEXTGYM_REPORT_FD"])
target = os.readlink(f"/proc/self/fd/{fd}")
ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # non-dumpable, as the code judge makes itself
os.set_inheritable(fd, False)
probe = (
    "import os\n"
    "reach, opened = [], 0\n"
    "for pid in (p for p in os.listdir('/proc') if p.isdigit() and int(p) != os.getpid()):\n"
    "    try:\n"
    "        fds = os.listdir(f'/proc/{pid}/fd')\n"
    "    except OSError:\n"
    "        continue\n"
    "    for n in fds:\n"
    "        try:\n"
    "            link = os.readlink(f'/proc/{pid}/fd/{n}')\n"
    "        except OSError:\n"
    "            continue\n"
    "        if link == TARGET:\n"
    "            reach.append(pid)\n"
    "print('reach', reach)\n"
).replace("TARGET", repr(target))
subprocess.run([sys.executable, "-c", probe], check=True)
os.write(fd, b"only the command writes here\n")
print("stdout is not the report")
"""


@pytest.mark.sandbox
def test_the_report_channel_is_the_commands_alone(backend):
    """`report=True`: the command's private channel comes back in `result.report`, and no other
    process of the sandbox holds it where another process of the same uid could open it (a scan of
    every `/proc/<pid>/fd` finds it nowhere), whichever uid runs textgym."""
    r = backend.run(code=REPORT_CHANNEL_PROBE, report=True)
    assert r.exit_code == 0, r.stderr
    assert r.report == "only the command writes here\n"
    assert r.stdout.splitlines() == ["reach []", "stdout is not the report"]
    plain = backend.run(code="import os; print(os.environ.get('TEXTGYM_REPORT_FD'))")
    assert plain.stdout == "None\n" and plain.report == ""  # no channel unless asked for


SHARED_STATE_WRITE = r"""
import ctypes, os
for d in ("/dev/shm", "/tmp", "/dev/mqueue"):
    try:
        open(os.path.join(d, "left-behind"), "w").write("x")
    except OSError:
        pass
libc = ctypes.CDLL(None, use_errno=True)
print("shm", libc.shmget(0, 4096, 0o1666), "msg", libc.msgget(0, 0o1666), "sem", libc.semget(0, 1, 0o1666))
"""
SHARED_STATE_READ = r"""
import os
for d in ("/dev/shm", "/tmp", "/dev/mqueue"):
    print(d, sorted(os.listdir(d)) if os.path.isdir(d) else "absent")
for kind in ("shm", "msg", "sem"):
    try:
        print(kind, len(open(f"/proc/sysvipc/{kind}").read().splitlines()[1:]))
    except OSError:
        print(kind, 0)
"""


@pytest.mark.sandbox
def test_shared_paths_and_ipc_do_not_carry_from_one_run_to_the_next(backend):
    """Files in /dev/shm, /tmp (and /dev/mqueue) and System V IPC objects one run leaves are gone
    in the next, also in a pooled container."""
    first = backend.run(code=SHARED_STATE_WRITE)
    assert first.ok, first.stderr
    assert all(int(v) >= 0 for v in first.stdout.split()[1::2]), first.stdout  # all three were made
    seen = backend.run(code=SHARED_STATE_READ).stdout.splitlines()
    assert seen[0] in ("/dev/shm []", "/dev/shm absent") and seen[1] == "/tmp []", seen
    assert seen[2] in ("/dev/mqueue []", "/dev/mqueue absent"), seen
    assert seen[3:] == ["shm 0", "msg 0", "sem 0"], seen
