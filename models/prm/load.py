"""Load any PRM folder this project writes: a LoRA PRM (``prm_config.json``) or an ensemble PRM
(``prm.json`` of kind ``ensemble``). Both score with ``score_solutions(problems, steps)``."""

from __future__ import annotations

from pathlib import Path

from prmloop.models.prm.ensemble_prm import ENSEMBLE_KIND, EnsemblePRM
from prmloop.models.prm.model import PRM

__all__ = ["load_prm"]


def load_prm(path: Path, *, cache_dir: Path | None = None, threads: int | None = None) -> PRM | EnsemblePRM:
    """The PRM saved in ``path``; ``cache_dir``: where an ensemble keeps its step features.

    Raises:
        FileNotFoundError: ``path`` holds neither kind of PRM (names what was expected).
    """
    path = Path(path)
    if (path / "prm.json").is_file():
        import json

        kind = json.loads((path / "prm.json").read_text()).get("kind")
        if kind == ENSEMBLE_KIND:
            return EnsemblePRM.load(path, cache_dir=cache_dir, threads=threads)
    if (path / "prm_config.json").is_file():
        return PRM.load(path)
    raise FileNotFoundError(
        f"{path}: not a PRM folder (expected prm_config.json of a LoRA PRM or prm.json of an ensemble PRM); "
        "`prmloop models list` shows the registered PRMs and their folders"
    )
