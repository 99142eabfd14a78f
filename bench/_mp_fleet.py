"""torchfleet's side of bench/model_parallel.py: the example's Module through ``torchfleet.Trainer``.

    OMP_NUM_THREADS=1 python bench/_mp_fleet.py tp2dp2 --out tf.json    # the Trainer starts ranks 1-3

  ddp      strategy="ddp";
  fsdp     FSDPStrategy(auto_wrap_policy={Block}): every block, then the model, sharded (raw_fsdp's units);
  tp2dp2   ModelParallelStrategy(data_parallel_size=2, tensor_parallel_size=2): the example Module's
           ``configure_model`` (its ``parallelize``) and its ``backward`` under loss_parallel.
Set up as a user would for speed (logger=False, no checkpointing, progress bar or summary); training_step
logs the loss every step (no sync_dist).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from _mp_common import StepClock, config, data, mesh_shape, parse_args

import torchfleet as tf
from torchfleet.examples.tp_transformer import Block, InOrder, TPTransformer
from torchfleet.strategies import FSDPStrategy, ModelParallelStrategy

torch.set_num_threads(1)


class Timed(TPTransformer):
    def __init__(self, clock: StepClock, **cfg) -> None:
        super().__init__(**cfg)
        self.clock = clock

    def training_step(self, batch, batch_idx):
        tokens, targets = batch
        logits = self(tokens)
        with self._loss_context():
            loss = F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())
        self.log("train_loss", loss.to_local() if hasattr(loss, "to_local") else loss)
        return loss

    def on_train_batch_end(self, outputs, batch, batch_idx):
        self.clock.step_end()
        if len(self.clock.ends) == self.clock.args.steps:  # measured where the raw loop measures: after the last
            self.clock.finish(self, self.trainer.optimizers[0])  # step, before fit ends (fsdp then gathers)


def main() -> None:
    args = parse_args()
    dp, tp = mesh_shape(args.variant, 4)
    strategy = {"ddp": "ddp", "fsdp": FSDPStrategy(auto_wrap_policy={Block}),
                "tp2dp2": ModelParallelStrategy(data_parallel_size=dp, tensor_parallel_size=tp)}[args.variant]
    clock = StepClock(args)
    cfg = config(args)
    model = Timed(clock, **vars(cfg))
    dataset = data(args)
    loader = torch.utils.data.DataLoader(dataset, batch_size=args.global_batch // dp, sampler=InOrder(dataset))
    trainer = tf.Trainer(strategy=strategy, accelerator="cpu", devices=4, max_epochs=1, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                         num_sanity_val_steps=0)
    trainer.fit(model, loader)


if __name__ == "__main__":
    main()
