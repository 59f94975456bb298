"""One training stage's loop: token budget, accumulation, plateau schedule, best checkpoint, resume.

LoLCATs runs both stages through the same loop (docs/linear.md §3, §4): AdamW (weight decay 0),
batch 1 × accumulation 8 of packed 1024-token chunks, gradient clipping at 1.0,
``ReduceLROnPlateau(factor=0.1, patience=10, min_lr=1e-5)`` stepped on the validation loss at
each evaluation, and the checkpoint with the best validation loss reloaded at the end. Here the
budget is a number of training tokens rather than epochs, and a stage folder holds everything
needed to pick the run up again in another session::

    <stage>/last.safetensors    retrofit tensors after the latest saved step
    <stage>/trainer.pt          optimiser, scheduler, step, best loss, wall time, RNG
    <stage>/best.safetensors    best validation loss so far
    <stage>/log.jsonl           one row per evaluation and per step (rows past the saved step are
                                dropped on resume, so a killed run never logs a step twice)
    <stage>/done.json           written when the budget is spent; a resumed run then skips the stage

A session's processes end with it, so a stage saves every ``save_every`` steps, every
``save_minutes`` of wall time and after every evaluation (``best.safetensors`` never runs ahead of
``trainer.pt``), and SIGTERM or a first Ctrl-C stops it at the next micro-batch with the last
finished step saved.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn as nn
from transformers import PreTrainedModel

from ..jsonl import append_jsonl
from ..linear.checkpoint import load_checkpoint, read_metadata, save_checkpoint
from ..runtime.notices import NOTICES
from .data import PackedData

__all__ = ["StageConfig", "StageResult", "run_stage"]

logger = logging.getLogger(__name__)

StepFn = Callable[..., dict]


@dataclass
class StageConfig:
    """One training stage.

    Attributes:
        stage: ``"transfer"`` (stage 1) or ``"finetune"`` (stage 2); names the folder.
        lr: AdamW learning rate (LoLCATs: 1e-2 for stage 1, 1e-4 for stage 2).
        tokens: training-token budget; steps = tokens // (batch_size · grad_accum · seq_len).
        grad_accum, batch_size: micro-batches per optimiser step and rows per micro-batch.
        eval_every: optimiser steps between evaluations (the plateau scheduler steps there).
        save_every: optimiser steps between resumable saves.
        save_minutes: also save once this many minutes of wall time passed since the last save
            (a slow step, as on a CPU, would otherwise put ``save_every`` steps at risk).
        val_batches: validation micro-batches per evaluation.
        max_grad_norm: gradient clipping.
        patience, lr_factor, min_lr: ``ReduceLROnPlateau``.
        lr_drop_at: from this optimiser step on, the learning rate is multiplied by ``lr_factor``
            once (not below ``min_lr``): the cut the plateau schedule makes when validation stalls,
            at a step of one's choosing, for a run whose validation keeps falling too slowly at a
            constant rate for that schedule to fire and for the plateau test to ever call it flat
            (``liger:256`` on a CPU budget). ``None``: the plateau schedule alone.
        max_minutes: stop (resumably) after this many minutes in this session.
    """

    stage: str
    lr: float
    tokens: int
    grad_accum: int = 8
    batch_size: int = 1
    eval_every: int = 100
    save_every: int = 10
    save_minutes: float | None = 10.0
    val_batches: int = 8
    max_grad_norm: float = 1.0
    weight_decay: float = 0.0
    patience: int = 10
    lr_factor: float = 0.1
    min_lr: float = 1e-5
    lr_drop_at: int | None = None
    max_minutes: float | None = None

    def __post_init__(self) -> None:
        if self.tokens <= 0 or self.grad_accum <= 0 or self.batch_size <= 0:
            raise ValueError("tokens, grad_accum and batch_size must be positive")
        if self.lr_drop_at is not None and self.lr_drop_at <= 0:
            raise ValueError(f"lr_drop_at must be a step above 0, not {self.lr_drop_at}")

    def steps(self, seq_len: int) -> int:
        return max(1, self.tokens // (self.batch_size * self.grad_accum * seq_len))

    def check_lr_drop(self, seq_len: int) -> None:
        """Refuse an ``lr_drop_at`` at or past the stage's last step: it would never happen."""
        if self.lr_drop_at is not None and self.lr_drop_at >= (total := self.steps(seq_len)):
            raise ValueError(
                f"the {self.stage} stage ends at step {total}, so a learning-rate drop at step "
                f"{self.lr_drop_at} (--lr-{self.stage}-drop-at) would never happen: give an earlier "
                f"step or more tokens"
            )


@dataclass
class StageResult:
    """What a stage did (also ``done.json``)."""

    stage: str
    finished: bool
    steps: int
    steps_total: int
    tokens: int
    wall_s: float
    tokens_per_s: float
    best_val: float | None
    best_step: int | None
    first_val: float | None
    last_train_loss: float | None
    lr: float
    out_dir: str


def _batch(ids: torch.Tensor, labels: torch.Tensor, index: int, b: int) -> tuple[torch.Tensor, torch.Tensor]:
    # Cycle through the chunks: a budget larger than the data runs extra epochs.
    rows = [(index * b + i) % len(ids) for i in range(b)]
    return ids[rows], labels[rows]


def _val_rows(data: PackedData, val_batches: int, batch_size: int) -> int:
    """How many validation chunks an evaluation reads (``_batch`` wraps around past the end)."""
    return min(val_batches, math.ceil(len(data.val_ids) / batch_size)) * batch_size


def _val_key(data: PackedData, val_batches: int, batch_size: int) -> str:
    """A digest of the validation chunks an evaluation reads: losses on two keys are not comparable."""
    rows = [i % len(data.val_ids) for i in range(_val_rows(data, val_batches, batch_size))]
    h = hashlib.sha256()
    for t in (data.val_ids[rows], data.val_labels[rows]):
        h.update(t.to(torch.int64).contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def _saved_val_key(st: dict, out: Path, data: PackedData, cfg: StageConfig) -> str:
    """The validation key a saved stage was evaluated on.

    ``trainer.pt`` files written before the key was recorded hold none; their checkpoint's stage
    config names the chunk count, and validation chunks of one source are a prefix of each other.
    """
    if "val_key" in st:
        return st["val_key"]
    saved = read_metadata(out / "last.safetensors").get("stage_config", {})
    return _val_key(data, saved.get("val_batches", cfg.val_batches), saved.get("batch_size", cfg.batch_size))


@torch.no_grad()
def _evaluate(
    model: PreTrainedModel, step_fn: StepFn, data: PackedData, cfg: StageConfig, device
) -> list[float]:
    """The validation loss of each validation batch (their mean is the stage's validation loss)."""
    model.eval()
    n = _val_rows(data, cfg.val_batches, cfg.batch_size) // cfg.batch_size
    losses = []
    for i in range(n):
        x, y = _batch(data.val_ids, data.val_labels, i, cfg.batch_size)
        losses.append(step_fn(model, x.to(device), y.to(device), backward=False)["loss"])
    return losses


def _log(path: Path, row: dict) -> None:
    append_jsonl(path, row)


def _trim_log(path: Path, step: int, lr_dropped: bool = True) -> int:
    """Drop the rows ``path`` logged after ``step`` (the saved step a run resumes from); returns how many.

    A run killed between saves has logged steps it will now train again; kept, they would appear
    twice in the loss curve. A torn last line (killed mid-write) goes too, and so does a learning-rate
    drop the saved state has not made yet (``lr_dropped`` False): the resumed run makes it again.
    """
    if not path.exists():
        return 0
    kept, dropped = [], 0
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            dropped += 1
            continue
        if row.get("step", 0) <= step and (lr_dropped or "lr_drop" not in row):
            kept.append(line)
        else:
            dropped += 1
    if dropped:
        tmp = path.with_suffix(".tmp")
        tmp.write_text("".join(line + "\n" for line in kept), encoding="utf-8")
        os.replace(tmp, path)
    return dropped


class _StopRequest:
    """SIGTERM or a first SIGINT asks the loop to stop and save; a second SIGINT interrupts at once.

    Handlers can only be set from the main thread; elsewhere (a Ray task, a test thread) this does
    nothing and the periodic saves are what a kill can lose.
    """

    def __init__(self) -> None:
        self.signal: int | None = None
        self._previous: dict[int, object] = {}

    def _handle(self, signum, frame) -> None:
        if self.signal is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.signal = signum
        NOTICES.info(
            "%s: stopping at the next micro-batch and saving the last finished step",
            signal.Signals(signum).name,
        )

    def __enter__(self) -> _StopRequest:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


def run_stage(
    model: PreTrainedModel,
    params: list[nn.Parameter],
    step_fn: StepFn,
    data: PackedData,
    cfg: StageConfig,
    out_dir: str | os.PathLike,
    meta: dict | None = None,
    resume: bool = True,
    progress: bool = True,
) -> StageResult:
    """Train ``params`` with ``step_fn`` until the token budget (or ``max_minutes``) is spent.

    Args:
        model: a converted model whose trainable tensors are ``params``.
        params: what AdamW updates.
        step_fn: ``step_fn(model, ids, labels, scale=..., backward=...) -> {"loss": float, ...}``;
            it runs backward itself (``transfer_step``, ``finetune.lm_step``).
        data: packed training and validation chunks.
        cfg: the stage's settings.
        out_dir: the stage folder (created).
        meta: JSON facts stored with every checkpoint (data, budget, ...).
        resume: continue from ``trainer.pt`` if present; skip the stage if ``done.json`` exists.
        progress: show a tqdm bar.

    Returns:
        A ``StageResult``. When finished, the model holds the best checkpoint's tensors.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    run = _StageRun(model, params, step_fn, data, cfg, out, meta, progress)
    if resume and (done := run.already_done()) is not None:
        return done
    if resume and run.state_path.exists():
        run.restore()
    else:
        # A fresh start: nothing of an earlier run in this folder may be mistaken for this one.
        for name in ("log.jsonl", "done.json", "trainer.pt", "last.safetensors", "best.safetensors"):
            (out / name).unlink(missing_ok=True)
    run.start_clock()
    if run.step == 0 or run.val_changed:
        run.evaluate()
        if run.val_changed:
            run.save_state()
    finished = run.train()
    if not finished:
        run.save_state()
    model.eval()
    result = run.result(finished)
    if finished:
        # LoLCATs' load_best_model_at_end.
        load_checkpoint(model, out / "best.safetensors")
        run.done_path.write_text(json.dumps(asdict(result), indent=2))
    return result


class _StageRun:
    """One stage's optimiser, schedule and resumable state, and the steps that move them (``run_stage``).

    What ``trainer.pt`` holds is exactly :meth:`save_state`'s dict; :meth:`restore` reads it back.
    """

    def __init__(self, model, params, step_fn, data: PackedData, cfg: StageConfig, out: Path, meta, progress):
        self.model, self.params, self.step_fn, self.data, self.cfg, self.out = (
            model,
            params,
            step_fn,
            data,
            cfg,
            out,
        )
        self.progress = progress
        self.done_path, self.state_path = out / "done.json", out / "trainer.pt"
        self.steps_total = cfg.steps(data.train_ids.shape[1])
        self.tokens_per_step = cfg.batch_size * cfg.grad_accum * data.train_ids.shape[1]
        self.meta = dict(meta or {}, stage=cfg.stage, stage_config=asdict(cfg))
        self.device = next(model.parameters()).device
        self.opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
        self.sched = torch.optim.lr_scheduler.ReduceLROnPlateau(
            self.opt, mode="min", factor=cfg.lr_factor, patience=cfg.patience, min_lr=cfg.min_lr
        )
        cfg.check_lr_drop(data.train_ids.shape[1])
        self.step, self.wall_prev, self.best_val, self.best_step = 0, 0.0, math.inf, None
        # The step the learning rate was cut at (cfg.lr_drop_at), once it was: a resumed run must
        # ask for the same cut, or its folder would mix two schedules.
        self.lr_dropped_at: int | None = None
        self.first_val: float | None = None
        self.train_loss: float | None = None
        self.val_key, self.val_changed = _val_key(data, cfg.val_batches, cfg.batch_size), False
        self.t0 = self.last_save = time.perf_counter()

    def already_done(self) -> StageResult | None:
        """The finished stage's result (its best checkpoint loaded), or ``None`` to train.

        A ``done.json`` of fewer steps than the budget asks now is removed: training carries on
        from the last step (``trainer.pt``).
        """
        if not self.done_path.exists():
            return None
        result = StageResult(**json.loads(self.done_path.read_text()))
        if result.steps >= self.steps_total:
            best = self.out / "best.safetensors"
            load_checkpoint(self.model, best if best.exists() else self.out / "last.safetensors")
            logger.info(
                "%s already done (%d steps); loaded its best checkpoint", self.cfg.stage, result.steps
            )
            return result
        logger.info("extending %s from %d to %d steps", self.cfg.stage, result.steps, self.steps_total)
        self.done_path.unlink()
        return None

    def restore(self) -> None:
        """Continue from ``trainer.pt`` and ``last.safetensors``."""
        cfg, out = self.cfg, self.out
        load_checkpoint(self.model, out / "last.safetensors")
        # On the CPU first: a run may resume on another device than it was saved from (a GPU run
        # continued on a CPU box); the optimiser moves its state to the parameters' device.
        st = torch.load(self.state_path, weights_only=False, map_location="cpu")
        self.opt.load_state_dict(st["optimizer"])
        self.sched.load_state_dict(st["scheduler"])
        self.step, self.wall_prev = st["step"], st["wall_s"]
        self.lr_dropped_at = st.get("lr_dropped_at")
        self._check_lr_drop()
        if dropped := _trim_log(out / "log.jsonl", self.step, self.lr_dropped_at is not None):
            logger.info("dropped %d log rows written after the saved step %d", dropped, self.step)
        self.best_val, self.best_step = st["best_val"], st["best_step"]
        self.first_val, self.train_loss = st["first_val"], st["train_loss"]
        torch.set_rng_state(st["rng"])
        logger.info("resuming %s at step %d/%d", cfg.stage, self.step, self.steps_total)
        if _saved_val_key(st, out, self.data, cfg) != self.val_key:
            # Another validation set (more chunks, say): its losses are not comparable with the
            # saved best, so the best and the plateau schedule start again from this step.
            self.val_changed = True
            self.best_val, self.best_step = math.inf, None
            self.sched.best, self.sched.num_bad_epochs = self.sched.mode_worse, 0
            logger.info(
                "%s: the validation set changed; the best checkpoint restarts at step %d",
                cfg.stage,
                self.step,
            )

    def _check_lr_drop(self) -> None:
        """Refuse a resume whose ``lr_drop_at`` disagrees with what the saved run did or can still do."""
        at, done = self.cfg.lr_drop_at, self.lr_dropped_at
        flag = f"--lr-{self.cfg.stage}-drop-at"
        if done is not None and at != done:
            raise ValueError(
                f"this {self.cfg.stage} stage cut its learning rate at step {done}: resume it with "
                f"{flag} {done}, or start a new run folder"
            )
        if done is None and at is not None and at < self.step:
            raise ValueError(
                f"this {self.cfg.stage} stage is at step {self.step} already, past a drop at step {at}: "
                f"give {flag} {self.step} or later"
            )

    def _drop_lr_if_due(self) -> None:
        """Cut the learning rate once, before the first optimiser step past ``cfg.lr_drop_at``."""
        cfg = self.cfg
        if cfg.lr_drop_at is None or self.lr_dropped_at is not None or self.step < cfg.lr_drop_at:
            return
        before = self.opt.param_groups[0]["lr"]
        for group in self.opt.param_groups:
            group["lr"] = max(group["lr"] * cfg.lr_factor, cfg.min_lr)
        self.lr_dropped_at = self.step
        after = self.opt.param_groups[0]["lr"]
        tokens = self.step * self.tokens_per_step
        _log(
            self.out / "log.jsonl",
            {"step": self.step, "tokens": tokens, "lr_drop": {"from": before, "to": after}},
        )
        NOTICES.info(f"{cfg.stage}: learning rate {before:.3g} -> {after:.3g} from step {self.step} on")

    def start_clock(self) -> None:
        self.t0 = self.last_save = time.perf_counter()

    def wall(self) -> float:
        """Training seconds over every session of this stage."""
        return self.wall_prev + time.perf_counter() - self.t0

    def save_state(self) -> None:
        self.last_save = time.perf_counter()
        tokens = self.step * self.tokens_per_step
        save_checkpoint(self.model, self.out / "last.safetensors", **self.meta, step=self.step, tokens=tokens)
        state = {
            "optimizer": self.opt.state_dict(),
            "scheduler": self.sched.state_dict(),
            "step": self.step,
            "wall_s": self.wall(),
            "best_val": self.best_val,
            "best_step": self.best_step,
            "first_val": self.first_val,
            "train_loss": self.train_loss,
            "rng": torch.get_rng_state(),
            "val_key": self.val_key,
            "lr_dropped_at": self.lr_dropped_at,
        }
        tmp = self.state_path.with_suffix(".tmp")
        torch.save(state, tmp)
        os.replace(tmp, self.state_path)

    def evaluate(self) -> float:
        """Validation loss now; steps the plateau schedule, keeps the best checkpoint, logs it."""
        cfg, tokens = self.cfg, self.step * self.tokens_per_step
        losses = _evaluate(self.model, self.step_fn, self.data, cfg, self.device)
        val = sum(losses) / len(losses)
        if self.first_val is None:
            self.first_val = val
        self.sched.step(val)
        if val < self.best_val:
            self.best_val, self.best_step = val, self.step
            save_checkpoint(
                self.model,
                self.out / "best.safetensors",
                **self.meta,
                step=self.step,
                tokens=tokens,
                val_loss=val,
            )
        _log(
            self.out / "log.jsonl",
            {
                "step": self.step,
                "tokens": tokens,
                "val_loss": val,
                "val_chunks": _val_rows(self.data, cfg.val_batches, cfg.batch_size),
                "val_key": self.val_key,
                # Per batch, so whether a stretch of training still moves the loss can be tested
                # against the spread between held-out chunks (train/plateau.py).
                "val_losses": [round(x, 6) for x in losses],
                "lr": self.opt.param_groups[0]["lr"],
                "wall_s": round(self.wall(), 1),
            },
        )
        if not self.progress:
            # Without a bar a long run would be silent: one line per validation instead.
            train = self.train_loss if self.train_loss is None else f"{self.train_loss:.4g}"
            NOTICES.info(
                f"{cfg.stage} step {self.step}/{self.steps_total} ({tokens:,} tokens): val {val:.4g}, "
                f"best {self.best_val:.4g}, train {train}, {self.wall():.0f} s"
            )
        return val

    def optimiser_step(self, stop: _StopRequest) -> float | None:
        """One optimiser step over ``grad_accum`` micro-batches: its mean loss, or ``None`` when a
        signal arrived first (the parameters, gradients and random state are then those before it)."""
        cfg = self.cfg
        self.model.train()
        rng = torch.get_rng_state()
        loss = 0.0
        for micro in range(cfg.grad_accum):
            if stop.signal is not None:
                break
            x, y = _batch(
                self.data.train_ids,
                self.data.train_labels,
                self.step * cfg.grad_accum + micro,
                cfg.batch_size,
            )
            loss += (
                self.step_fn(self.model, x.to(self.device), y.to(self.device), scale=1.0 / cfg.grad_accum)[
                    "loss"
                ]
                / cfg.grad_accum
            )
        if stop.signal is not None:
            # Drop the partial gradients and the random draws of the unfinished step; the caller
            # saves the stage as unfinished.
            self.opt.zero_grad(set_to_none=True)
            torch.set_rng_state(rng)
            return None
        torch.nn.utils.clip_grad_norm_(self.params, cfg.max_grad_norm)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        self.step += 1
        self.train_loss = loss
        return loss

    def train(self) -> bool:
        """Steps until the budget is spent (``True``), ``max_minutes`` run out or a signal arrives."""
        from tqdm.auto import tqdm

        cfg = self.cfg
        bar = tqdm(total=self.steps_total, initial=self.step, desc=cfg.stage, unit="step",
                   disable=not self.progress, dynamic_ncols=True)  # fmt: skip
        finished = True
        session_start = time.perf_counter()
        with _StopRequest() as stop:
            while self.step < self.steps_total:
                if cfg.max_minutes is not None and time.perf_counter() - session_start > 60 * cfg.max_minutes:
                    finished = False
                    break
                self._drop_lr_if_due()
                ts = time.perf_counter()
                loss = self.optimiser_step(stop)
                if loss is None:
                    finished = False
                    break
                tok_s = self.tokens_per_step / (time.perf_counter() - ts)
                _log(
                    self.out / "log.jsonl",
                    {"step": self.step, "tokens": self.step * self.tokens_per_step, "train_loss": loss,
                     "lr": self.opt.param_groups[0]["lr"], "tok_s": round(tok_s, 1),
                     "wall_s": round(self.wall(), 1)},
                )  # fmt: skip
                evaluated = self.step % cfg.eval_every == 0 or self.step == self.steps_total
                if evaluated:
                    self.evaluate()
                bar.update(1)
                bar.set_postfix(loss=f"{loss:.4g}", best_val=f"{self.best_val:.4g}",
                                lr=f"{self.opt.param_groups[0]['lr']:.1e}", tok_s=f"{tok_s:.0f}")  # fmt: skip
                overdue = (
                    cfg.save_minutes is not None
                    and time.perf_counter() - self.last_save > 60 * cfg.save_minutes
                )
                if evaluated or overdue or self.step % cfg.save_every == 0 or self.step == self.steps_total:
                    self.save_state()
        bar.close()
        return finished

    def result(self, finished: bool) -> StageResult:
        tokens, wall = self.step * self.tokens_per_step, self.wall()
        return StageResult(
            stage=self.cfg.stage,
            finished=finished,
            steps=self.step,
            steps_total=self.steps_total,
            tokens=tokens,
            wall_s=round(wall, 1),
            tokens_per_s=round(tokens / max(wall, 1e-9), 1),
            best_val=None if math.isinf(self.best_val) else self.best_val,
            best_step=self.best_step,
            first_val=self.first_val,
            last_train_loss=self.train_loss,
            lr=self.opt.param_groups[0]["lr"],
            out_dir=str(self.out),
        )
