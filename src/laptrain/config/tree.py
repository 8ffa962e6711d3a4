"""Print the composed config as a Rich tree and the machine summary field note 001 asks for."""

from __future__ import annotations

from collections.abc import Iterable

from omegaconf import DictConfig, OmegaConf
from rich.console import Console
from rich.syntax import Syntax
from rich.tree import Tree

FIRST = ("hardware", "model", "data", "trainer", "callbacks", "logger", "paths")


def config_tree(cfg: DictConfig, order: Iterable[str] = FIRST) -> Tree:
    """One branch per top-level group, groups first, resolved."""
    tree = Tree("config", guide_style="dim")
    keys = [k for k in order if k in cfg] + [k for k in cfg if k not in order]
    for key in keys:
        value = cfg[key]
        text = (
            OmegaConf.to_yaml(value, resolve=True) if isinstance(value, DictConfig) else str(value)
        )
        tree.add(f"[bold]{key}[/bold]").add(
            Syntax(text.rstrip(), "yaml", background_color="default")
        )
    return tree


def print_config(cfg: DictConfig, console: Console | None = None) -> None:
    (console or Console()).print(config_tree(cfg))
