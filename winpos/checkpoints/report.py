"""``LoadReport``: what a checkpoint import did with every key, the same for every checkpoint family."""
from __future__ import annotations

from dataclasses import dataclass, field

_LISTED = 20  # keys listed per outcome in ``summary()``; the counts are always complete


@dataclass
class LoadReport:
    """What happened to every key of one import.

    source: the checkpoint family (``"sam2"``, ``"hiera"``, ``"detectron2"``, ...).
    target: what it was converted into, for ``summary()`` (e.g. ``"winpos ViTDet"``).
    matched: target keys whose value was copied unchanged under the same name, once the checkpoint's container
        prefix (``backbone.net.``, ``image_encoder.trunk.``) is removed.
    converted: ``(target key, how)`` for exact changes: a rename (``"renamed from '<source key>'"``, e.g. SAM's
        ``mlp.lin1`` -> ``mlp.fc1`` or any flat ``pos_embed`` -> ``pos_embed.pos_embed``) or a re-layout (NHWC ->
        flat, cls row dropped or added, abs -> abs-win). One rule for every format (``winpos.checkpoints.convert``).
    reshaped: ``(target key, how)`` for values that were transformed beyond a re-layout (relpos resampling,
        resized or materialized embeddings), some of them lossy.
    missing: ``(target key, why)`` for parameters the checkpoint lacks; they keep their initialization.
    unexpected: ``(source key, why)`` for checkpoint keys that were not loaded.
    unknown: the source keys among ``unexpected`` that no rule recognised (a strict load refuses them).
    lost: ``(key, why)`` for trunk weights the conversion loses: source trunk weights that do not load (LayerScale,
        register tokens, learned frequencies, biases) and target trunk weights left at their initialization; a
        conversion with any is partial (``winpos.checkpoints.convert.check_no_loss``).
    built_with: constructor arguments the import chose for the target from the checkpoint, beyond the caller's
        (``load_external``'s ``fit_pretrain_grid``: the pretraining grid; a LookHere file: its config's settings);
        shown first by ``summary()``.
    """

    source: str
    target: str = "winpos"
    matched: list[str] = field(default_factory=list)
    converted: list[tuple[str, str]] = field(default_factory=list)
    reshaped: list[tuple[str, str]] = field(default_factory=list)
    missing: list[tuple[str, str]] = field(default_factory=list)
    unexpected: list[tuple[str, str]] = field(default_factory=list)
    unknown: list[str] = field(default_factory=list)
    lost: list[tuple[str, str]] = field(default_factory=list)
    built_with: dict = field(default_factory=dict)

    def add_lost(self, key: str, why: str) -> None:
        self.lost.append((key, why))

    def add_matched(self, key: str) -> None:
        self.matched.append(key)

    def add_converted(self, key: str, how: str) -> None:
        self.converted.append((key, how))

    def add_reshaped(self, key: str, how: str) -> None:
        self.reshaped.append((key, how))

    def add_missing(self, key: str, why: str) -> None:
        self.missing.append((key, why))

    def add_unexpected(self, key: str, why: str, known: bool = True) -> None:
        """``known=False``: no rule recognised ``key`` (it also goes to ``unknown``)."""
        self.unexpected.append((key, why))
        if not known:
            self.unknown.append(key)

    def summary(self) -> str:
        """One count line, then the reshaped, missing, converted and unexpected keys with their reasons (the values
        that differ from the source or keep their initialization first)."""
        lines = [f"{self.source} -> {self.target}: {len(self.matched)} matched, {len(self.converted)} converted, "
                 f"{len(self.reshaped)} reshaped, {len(self.missing)} missing, {len(self.unexpected)} unexpected"]
        if self.lost:
            lines[0] += f", {len(self.lost)} LOST"
        if self.built_with:
            lines.append("  target built with " + ", ".join(f"{k}={v!r}" for k, v in self.built_with.items())
                         + " (from the checkpoint)")
        for title, items in (("lost", self.lost), ("reshaped", self.reshaped), ("missing", self.missing),
                             ("converted", self.converted), ("unexpected", self.unexpected)):
            lines += [f"  {title} {key}: {why}" for key, why in items[:_LISTED]]
            if len(items) > _LISTED:
                lines.append(f"  ... and {len(items) - _LISTED} more {title}")
        return "\n".join(lines)


__all__ = ["LoadReport"]
