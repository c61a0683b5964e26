"""Training metrics to TensorBoard and ``metrics.jsonl`` (always; the JSONL also carries each rollout's prompt
sources) and Weights & Biases (``--use-wandb``).

W&B (0.31) writes runs from a separate service process. ``run.finish()`` returns once that service has
acknowledged the run's exit record, but the service flushes the run's transaction log (``run-*.wandb``, what
``wandb sync`` uploads and offline readers read) only when it closes the run's stream, which ``finish()`` merely
asks for. ``wandb.teardown()`` shuts the service down and waits for its process to exit, after closing every
stream; so ``Tracker.close()`` calls both, and when it returns the run is complete on disk."""

import json
from pathlib import Path


class Tracker:
    def __init__(self, log_dir: str, use_wandb: bool = False, wandb_project: str = "vime_ext",
                 wandb_group: str | None = None, config: dict | None = None):
        from torch.utils.tensorboard import SummaryWriter

        Path(log_dir).mkdir(parents=True, exist_ok=True)
        self.log_dir = log_dir
        self.writer = SummaryWriter(log_dir=log_dir)
        self.jsonl = open(Path(log_dir) / "metrics.jsonl", "a")
        self.wandb = None
        if use_wandb:
            try:
                import wandb
            except ImportError as err:
                raise RuntimeError("--use-wandb needs the wandb package (pip install wandb)") from err
            self.wandb = wandb.init(project=wandb_project, group=wandb_group, config=config or {})

    def log(self, metrics: dict[str, float], step: int, extra: dict | None = None) -> None:
        for name, value in metrics.items():
            self.writer.add_scalar(name, value, step)
        self.writer.flush()
        self.jsonl.write(json.dumps({"step": step, **metrics, **(extra or {})}) + "\n")
        self.jsonl.flush()
        if self.wandb is not None:
            self.wandb.log(metrics, step=step)

    def close(self) -> None:
        self.writer.close()
        self.jsonl.close()
        if self.wandb is not None:
            import wandb

            self.wandb.finish()
            wandb.teardown()  # waits until the service has written and closed the run's files (see above)
            self.wandb = None
