"""A run on a GPU hands back CPU objects: checkpoints that load and resume on the CPU, the model, predictions."""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import DataLoader

import torchfleet as tf
from tests.gpu.conftest import needs_cuda
from tests.helpers import Regressor, loader, make_data

pytestmark = needs_cuda(1, "checks what a CUDA run leaves behind")


def _trainer(accelerator: str, max_steps: int, **kw) -> tf.Trainer:
    return tf.Trainer(accelerator=accelerator, devices=1, max_steps=max_steps, logger=False,
                      enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                      num_sanity_val_steps=0, **kw)


def _weights(model: nn.Module) -> dict:
    return {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}


def test_a_checkpoint_written_on_cuda_loads_on_the_cpu_and_resumes_there(tmp_path):
    path = tmp_path / "cuda.ckpt"
    tf.seed_everything(0)
    model = Regressor()
    trainer = _trainer("cuda", max_steps=5)
    trainer.fit(model, loader(64, batch_size=8, shuffle=True))  # 8 batches an epoch: stops inside epoch 0
    trainer.save_checkpoint(path)

    ckpt = torch.load(path, map_location="cpu", weights_only=True)
    tensors = [v for v in ckpt["state_dict"].values()]
    assert tensors and all(t.device.type == "cpu" for t in tensors)
    assert ckpt["global_step"] == 5
    loaded = Regressor.load_from_checkpoint(str(path))
    assert all(p.device.type == "cpu" for p in loaded.parameters())

    tf.seed_everything(0)
    straight = Regressor()
    straight_trainer = _trainer("cuda", max_steps=12)
    straight_trainer.fit(straight, loader(64, batch_size=8, shuffle=True))

    resumed = Regressor()
    cpu_trainer = _trainer("cpu", max_steps=12)
    cpu_trainer.fit(resumed, loader(64, batch_size=8, shuffle=True), ckpt_path=path)
    assert cpu_trainer.global_step == 12 and cpu_trainer.current_epoch == straight_trainer.current_epoch
    assert all(p.device.type == "cpu" for p in resumed.parameters())
    # the same batches in the same order; only the last 7 steps ran on another device
    for k, v in _weights(straight).items():
        torch.testing.assert_close(_weights(resumed)[k], v, atol=1e-4, rtol=1e-4)


def test_after_a_cuda_stage_the_model_is_on_the_cpu_and_predictions_too():
    model = Regressor()
    trainer = _trainer("cuda", max_steps=3)
    trainer.fit(model, loader())
    assert all(p.device.type == "cpu" for p in model.parameters())
    preds = trainer.predict(model, loader(16))
    assert all(p.device.type == "cpu" for p in preds)
    x = make_data(16).tensors[0]
    with torch.no_grad():
        # the weights the GPU trained, used on the CPU as Lightning users do after fit
        torch.testing.assert_close(torch.cat(preds), model(x), atol=1e-5, rtol=1e-5)
    metrics = trainer.validate(model, DataLoader(make_data(16), batch_size=8), verbose=False)
    assert metrics[0]["val_loss"] >= 0 and next(model.parameters()).device.type == "cpu"
