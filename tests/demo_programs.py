"""Lightning's demo programs, run under torchfleet or Lightning (``python demo_programs.py LIB OUT``), so the
two libraries' results can be compared: each program seeds, builds a demo model with Lightning's API, trains a
few steps on the same data, and the weights (and outputs) are saved to OUT.

The language models train on seeded random tokens rather than WikiText2 (Lightning's downloads its text;
torchfleet's is generated): the data are the same for both libraries. Under Lightning only Lightning is
imported, so the script runs in a virtual environment without torchfleet.
"""

from __future__ import annotations

import sys

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

if sys.argv[1] == "lightning":
    import lightning.pytorch as pl
    from lightning.pytorch.demos import LightningLSTM, LightningTransformer, SequenceSampler, Transformer
    from lightning.pytorch.demos.boring_classes import (
        BoringDataModule,
        BoringModel,
        DemoModel,
        ManualOptimBoringModel,
    )
else:
    import torchfleet as pl
    from torchfleet.demos import LightningLSTM, LightningTransformer, SequenceSampler, Transformer
    from torchfleet.demos.boring_classes import (
        BoringDataModule,
        BoringModel,
        DemoModel,
        ManualOptimBoringModel,
    )


def trainer(**kwargs):
    return pl.Trainer(accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False,
                      enable_model_summary=False, **kwargs)


def tokens(vocab: int, blocks: int, block: int) -> TensorDataset:
    g = torch.Generator().manual_seed(1)
    stream = torch.randint(vocab, (blocks * block + 1,), generator=g)
    return TensorDataset(stream[:-1].view(blocks, block), stream[1:].view(blocks, block))


class OfflineTransformer(LightningTransformer):
    def prepare_data(self):  # Lightning's downloads WikiText-2 here
        pass


class OfflineLSTM(LightningLSTM):
    def prepare_data(self):
        pass


def weights(model) -> dict:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def main() -> None:
    out = {}
    # the transformer example's model and step: forward(inputs, target) -> flattened log-probs for nll_loss
    pl.seed_everything(42)
    model = Transformer(vocab_size=50, ninp=32, nhead=2, nhid=64, nlayers=2)
    data = tokens(50, 8, 12)
    model.eval()
    with torch.no_grad():
        out["transformer_output"] = model(data.tensors[0][:2], data.tensors[1][:2])
    pl.seed_everything(42)
    lit = OfflineTransformer(vocab_size=50)
    trainer(max_steps=3).fit(lit, DataLoader(data, batch_size=4, shuffle=True))
    out["lightning_transformer"] = weights(lit)
    inputs, target = data.tensors
    out["transformer_loss"] = F.nll_loss(lit(inputs, target), target.view(-1)).detach()

    pl.seed_everything(3)
    lstm = OfflineLSTM(vocab_size=40)
    lstm_data = tokens(40, 12, 6)
    trainer(max_steps=4).fit(lstm, DataLoader(lstm_data, batch_sampler=SequenceSampler(lstm_data, batch_size=3)))
    out["lstm"] = weights(lstm)

    pl.seed_everything(0)
    boring = BoringModel()
    t = trainer(max_epochs=2, limit_train_batches=16, limit_val_batches=4)
    t.fit(boring)
    out["boring"] = weights(boring)
    out["boring_predictions"] = torch.cat(t.predict(boring))  # predict_dataloader() draws its data now
    # data the *_dataloader hooks draw from the global generator: asked for in Lightning's order and context
    # (val_dataloader() inside the sanity check's isolate_rng, or not at all without validation)
    draws = []
    for kwargs in ({"limit_val_batches": 0}, {"num_sanity_val_steps": 0}, {}):
        pl.seed_everything(0)
        trainer(**{"max_epochs": 2, "limit_train_batches": 4, "limit_val_batches": 2, **kwargs}).fit(BoringModel())
        draws.append(torch.rand(3))
    out["rng_after_fit"] = torch.stack(draws)
    pl.seed_everything(0)
    dm = BoringDataModule()
    out["boring_datamodule"] = dm.random_full.data.clone()
    manual = ManualOptimBoringModel()
    trainer(max_epochs=1, limit_train_batches=8).fit(manual, datamodule=dm)
    out["manual"] = weights(manual)
    pl.seed_everything(1)
    demo = DemoModel()
    trainer(max_steps=5).fit(demo, DataLoader(torch.randn(20, 32), batch_size=4))
    out["demo"] = weights(demo)
    torch.save(out, sys.argv[2])


if __name__ == "__main__":
    main()
