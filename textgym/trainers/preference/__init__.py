"""The preference trainers: offline (DPO, IPO, SimPO, ORPO, KTO) and online DPO.

`offline` trains on pair files; `online` samples its pairs, built and scored in `online_pairs`.

`from textgym.trainers.preference import PreferenceTrainer` keeps working (the class moved to
`textgym.trainers.preference.offline` when this module became a package).
"""

from textgym._lazy import lazy_exports

_EXPORTS = {
    "PreferenceTrainer": "textgym.trainers.preference.offline",
    "OnlineDPOTrainer": "textgym.trainers.preference.online",
}
__getattr__ = lazy_exports(__name__, _EXPORTS)
__all__ = sorted(_EXPORTS)
