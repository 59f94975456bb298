"""Training the linear-attention baselines and SWA + LoRA: data, the two stages, the loop, curves, CLI.

    >>> from sinkwindow.train import TrainConfig, train_baseline
    >>> train_baseline(model, tokenizer, "lolcats:256", "runs/lolcats256",
    ...                TrainConfig(data="alpaca.jsonl", transfer_tokens=1_000_000, finetune_tokens=1_000_000))

``data`` packs training text into chunks; ``transfer`` is stage 1 (feature maps and window factors
mimic softmax attention), ``finetune`` stage 2's next-token loss on the LoRA adapters
(``sinkwindow.linear.lora``); ``stage`` is the resumable loop both share, ``trainer`` the recipes and ``train_baseline``; ``curves`` plots the
logs; ``cli`` adds ``sinkwindow train``. What training produces is loaded by ``sinkwindow.linear``,
which never imports this package.
"""

from .._lazy import lazy_package

# Public names by the module that defines them; each loads on first use (see _lazy.py).
__all__ = lazy_package(
    __name__,
    {
        ".curves": ["plot_curves", "read_log"],
        ".data": ["PackedData", "load_training_data", "pack"],
        ".finetune": ["lm_step"],
        ".trainer": [
            "StageConfig",
            "StageResult",
            "TrainConfig",
            "recipe_for",
            "run_stage",
            "train_baseline",
        ],
        ".transfer": ["prepare_transfer", "reference_transfer_loss", "transfer_step"],
    },
)
