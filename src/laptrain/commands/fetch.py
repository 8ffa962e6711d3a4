"""``laptrain fetch [MODEL ...]``: put the pretrained weights a ``conf/model/`` preset names into
the cache, resolved as a run resolves them, so the run starts offline; no model: list the cache."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from laptrain.project import conf_dir


def model_source(name: str, root: Path | None = None) -> object:
    """``pretrained`` of ``conf/model/<name>.yaml``; one line naming the choices otherwise."""
    from omegaconf import OmegaConf

    folder = root or conf_dir() / "model"
    path = folder / f"{name}.yaml"
    if not path.is_file():
        names = ", ".join(sorted(p.stem for p in folder.glob("*.yaml")))
        raise ValueError(f"no model={name}: choose one of {names} (files in conf/model/)")
    node = OmegaConf.to_container(OmegaConf.load(path))
    source = node.get("pretrained") if isinstance(node, dict) else None
    if not source:
        raise ValueError(
            f"model={name} loads no pretrained weights (conf/model/{name}.yaml: pretrained is "
            "null): nothing to fetch"
        )
    return source


def cached_lines() -> list[str]:
    """One line per finished cache entry: kind, source, size, folder."""
    from laptrain.pretrained.sources import list_cached, models_dir

    entries = list_cached()
    if not entries:
        return [f"no pretrained models cached in {models_dir()} (laptrain fetch MODEL adds one)"]
    return [f"{e.kind:5} {e.label}  {e.size_bytes / 1024**2:,.0f} MB  {e.path}" for e in entries]


def fetch_command(args: argparse.Namespace) -> int:
    from laptrain.pretrained.loading import describe_source, resolve
    from laptrain.pretrained.sources import looks_like_hub_name, tree_size

    try:
        for model in args.models:
            name = model.split("=", 1)[1] if model.startswith("model=") else model
            source = model_source(name)
            if (
                isinstance(source, str)
                and looks_like_hub_name(source)
                and not Path(source).exists()
            ):
                print(f"model={name}: {source} is a hub name; transformers fetches it when online")
                continue
            start = time.perf_counter()
            local, fetched = resolve(source)
            seconds = time.perf_counter() - start
            state = f"fetched in {seconds:.1f} s" if fetched else "already cached"
            print(
                f"model={name}: {describe_source(source)} {state}: {local} "
                f"({tree_size(Path(local)) / 1024**2:,.0f} MB)"
            )
    except (ValueError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if not args.models:
        print("\n".join(cached_lines()))
    return 0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "models", nargs="*", help="conf/model names (e.g. minilm_classifier); none: list the cache"
    )
