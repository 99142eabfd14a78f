"""torchfleet's side of bench/model_parallel.py: the example's Module through ``torchfleet.Trainer``.

    OMP_NUM_THREADS=1 python bench/_mp_fleet.py tp2dp2 --out tf.json    # the Trainer starts ranks 1-3

  ddp      strategy="ddp";
  fsdp     FSDPStrategy(auto_wrap_policy={Block}): every block, then the model, sharded (raw_fsdp's units);
  tp2dp2   ModelParallelStrategy(data_parallel_size=2, tensor_parallel_size=2): the example Module's
           ``configure_model`` (its ``parallelize``) and its ``backward`` under loss_parallel;
  pp2dp2   ModelParallelStrategy(pipeline_parallel_size=2, data_parallel_size=2, tensor_parallel_size=1,
           pipeline_schedule="1F1B", microbatches=2) on ``PipelinedGPT``: the example's GPT as one Sequential
           (``gpt_sequential``), its stages declared by ``configure_pipeline()``, each stage's blocks then the
           stage fully_shard over "data_parallel" in ``configure_model`` (raw_pp2dp2's layout).
Set up as a user would for speed (logger=False, no checkpointing, progress bar or summary); training_step
logs the loss every step (no sync_dist); under pipeline parallelism the schedule's step replaces training_step
and the loss is not logged (``PipelineSpec.log_loss_as`` would log it with sync_dist).
"""

from __future__ import annotations

import _mp_common as common
import torch
import torch.nn.functional as F
from _mp_common import StepClock, config, data, mesh_shape, parse_args

import torchfleet as tf
from torchfleet.examples.tp_transformer import Block, InOrder, TPTransformer
from torchfleet.strategies import FSDPStrategy, ModelParallelStrategy, PipelineSpec

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


class PipelinedGPT(tf.Module):
    """The example's GPT (same weights) as one Sequential, so that it declares pipeline stages; without a
    pipeline (or a mesh) the same Module trains unchanged."""

    def __init__(self, clock: StepClock) -> None:
        super().__init__()
        self.clock, self.cfg = clock, config(clock.args)
        self.layers = common.gpt_sequential(self.cfg)

    def forward(self, tokens):
        return self.layers(tokens)  # under pipeline parallelism: this rank's stage only

    def configure_pipeline(self) -> PipelineSpec:
        return PipelineSpec(split_points=[f"layers.{common.split_point(self.cfg)}"], loss_fn=common.token_loss)

    def configure_model(self) -> None:
        if self.device_mesh is None:
            return
        from torch.distributed.fsdp import fully_shard

        mesh = self.device_mesh["data_parallel"]
        for block in self.layers:
            if isinstance(block, Block):
                fully_shard(block, mesh=mesh)
        fully_shard(self, mesh=mesh)

    def training_step(self, batch, batch_idx):  # without pipeline parallelism
        tokens, targets = batch
        loss = common.token_loss(self(tokens), targets)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=3e-3, weight_decay=0.01)

    def on_train_batch_end(self, outputs, batch, batch_idx):
        self.clock.step_end()
        if len(self.clock.ends) == self.clock.args.steps:
            stages = common.pipeline_size(self.clock.args.variant)
            self.clock.finish(self, self.trainer.optimizers[0], stages=stages)


def main() -> None:
    args = parse_args()
    dp, tp = mesh_shape(args.variant, 4)
    strategies = {"ddp": lambda: "ddp", "fsdp": lambda: FSDPStrategy(auto_wrap_policy={Block}),
                  "tp2dp2": lambda: ModelParallelStrategy(data_parallel_size=dp, tensor_parallel_size=tp),
                  "pp2dp2": lambda: ModelParallelStrategy(
                      data_parallel_size=dp, tensor_parallel_size=tp, pipeline_parallel_size=2,
                      pipeline_schedule=common.SCHEDULE, microbatches=common.MICROBATCHES)}
    strategy = strategies[args.variant]()
    clock = StepClock(args)
    model = PipelinedGPT(clock) if args.variant == "pp2dp2" else Timed(clock, **vars(config(args)))
    dataset = data(args)
    loader = torch.utils.data.DataLoader(dataset, batch_size=args.global_batch // dp, sampler=InOrder(dataset))
    trainer = tf.Trainer(strategy=strategy, accelerator="cpu", devices=4, max_epochs=1, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                         num_sanity_val_steps=0)
    trainer.fit(model, loader)


if __name__ == "__main__":
    main()
