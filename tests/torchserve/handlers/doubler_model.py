"""The eager model of the BaseHandler test archive: multiplies by a learnt scale."""

import torch


class Doubler(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.scale = torch.nn.Parameter(torch.tensor(2.0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.scale
