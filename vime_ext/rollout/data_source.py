"""Where a rollout function gets its prompts: ``data_source.get_samples(num_groups)`` returns fresh groups of
Samples (prompt, label, metadata, indices filled), drawn from prompt data in the order of ``PromptDataset``
(epochs, optional shuffle with a fixed seed). The rollout manager owns one for training, whose position is
saved in checkpoints, and one per evaluation set."""

from vime_ext.agent.sample import Sample
from vime_ext.data.prompt_dataset import PromptDataset, PromptRecord


class DataSource:
    def __init__(self, records: list[PromptRecord], group_size: int, shuffle: bool = False, seed: int = 0):
        self.records, self.group_size = records, group_size
        self.dataset = PromptDataset(records, 1, shuffle=shuffle, seed=seed)

    def __len__(self) -> int:
        return len(self.records)

    def get_samples(self, num_groups: int) -> list[list[Sample]]:
        """``num_groups`` prompts (a rollout function asks for ``args.rollout_batch_size``, or its over-sampling
        batch), ``group_size`` Samples each, numbered from 0."""
        n = self.group_size
        groups = []
        for g in range(num_groups):
            record = self.dataset.next_batch()[0]
            groups.append([Sample(prompt=record.prompt, label=record.label,
                                  metadata={**record.metadata, "source": record.source}, group_index=g,
                                  index=g * n + i) for i in range(n)])
        return groups

    def state(self) -> dict[str, int]:
        return self.dataset.state()

    def load_state(self, state: dict[str, int]) -> None:
        self.dataset.load_state(state)
