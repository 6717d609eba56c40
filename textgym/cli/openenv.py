"""`textgym env serve-openenv ID`: serve any textgym env over OpenEnv's protocol (the `[interop]` extra).

The server is OpenEnv's own FastAPI app (`openenv.core.env_server.create_app`): `/ws` sessions,
`/reset`, `/step`, `/state`, `/schema`, `/health`. Wrap it back with `textgym/OpenEnv-v0`
(`--env-kwargs base_url=http://HOST:PORT`), or play it with any OpenEnv client.
"""

from __future__ import annotations

from typing import Annotated

import typer

from textgym.cli._common import EnvKwargs, fail, parse_kwargs

EnvIdArg = Annotated[str, typer.Argument(help="Environment id to serve, e.g. textgym/Wordle-v0.")]
Host = Annotated[str, typer.Option(help="Interface to bind (127.0.0.1: this machine only).")]
Port = Annotated[int, typer.Option(min=0, max=65535, help="Port to listen on (0: a free one).")]
ExposeOracle = Annotated[
    bool,
    typer.Option(
        "--oracle/--no-oracle",
        help="Put the env's oracle in the session state (OpenEnv-v0's oracle reads it; so can any client, "
        "the agent included: off unless asked).",
    ),
]


def serve_openenv_cmd(
    env_id: EnvIdArg,
    env_kwargs: EnvKwargs = None,
    host: Host = "127.0.0.1",
    port: Port = 8000,
    expose_oracle: ExposeOracle = False,
) -> None:
    """Serve ENV_ID over OpenEnv's protocol until Ctrl-C; the env's kwargs come from --env-kwargs k=v.

    Args:
        env_id: any id `textgym.envs.make` takes.
        env_kwargs: `key=value` strings (values parsed as YAML scalars).
        host: the interface to bind.
        port: the port (0: a free one, printed).
        expose_oracle: whether the session state carries the env's oracle.

    Raises:
        typer.Exit: code 2 when the extra is missing, the env cannot be made, or the port cannot be bound.

    Examples:
        >>> import inspect
        >>> list(inspect.signature(serve_openenv_cmd).parameters)
        ['env_id', 'env_kwargs', 'host', 'port', 'expose_oracle']
    """
    from textgym.envs import interop

    try:
        interop.require("openenv-core", "openenv")
        from textgym.envs.interop import openenv_server
    except ImportError as e:
        fail(str(e))
    kwargs = parse_kwargs(env_kwargs)
    try:
        server = openenv_server.serve_openenv(env_id, kwargs, host, port, expose_oracle=expose_oracle)
    except Exception as e:  # an unknown id, bad kwargs, a port in use
        fail(f"cannot serve {env_id} on {host}:{port}: {e}")
    typer.echo(  # plain text: the URL is never wrapped
        f"serving {env_id} over OpenEnv at {server.url} (Ctrl-C stops); play it with "
        f"textgym/OpenEnv-v0 --env-kwargs base_url={server.url}"
    )
    server.wait()
