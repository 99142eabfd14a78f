"""Three more kinds of public Lightning/Fabric program, written as their users write them (our own code).

- A Q-learning agent in the style of Lightning's DQN template: the module plays in a small environment, fills a
  replay buffer in ``__init__`` (random numbers drawn between ``seed_everything`` and ``fit``), serves batches from
  an IterableDataset over the buffer through its own ``train_dataloader`` hook, plays one more step in every
  ``training_step`` (epsilon-greedy, Python's ``random``) and copies its network to a target network.
- A language model over the demo ``Transformer`` in the style of Lightning's basic transformer example:
  ``random_split``, a shuffled training loader, gradient clipping, the default sanity check, test after fit; its
  dataset masks tokens at random in ``__getitem__`` and ``limit_train_batches`` stops each epoch early.
- Fabric's k-fold cross-validation: one model and optimizer per fold set up together, a ``SubsetRandomSampler``
  per fold and loader passed to ``setup_dataloaders``, dropout, a torchmetrics accuracy and ``all_gather``.

Only the import lines name torchfleet (tests/ported/lightning_imports.py turns them back to Lightning's).
"""

from __future__ import annotations

import random
from collections import deque, namedtuple
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import (
    DataLoader,
    Dataset,
    IterableDataset,
    SubsetRandomSampler,
    TensorDataset,
    random_split,
)

from tests.ported.programs import full_weights
from torchfleet import Fleet as Fabric
from torchfleet import Module as LightningModule
from torchfleet import Trainer, seed_everything
from torchfleet.demos import Transformer

# ---------------------------------------------------------------------------- Q-learning (DQN template)
Experience = namedtuple("Experience", ["state", "action", "reward", "done", "new_state"])


class Corridor:
    """Cells 0..length-1; action 1 moves right, 0 left; reaching the right end pays 1 and ends the episode."""

    def __init__(self, length: int = 6, max_steps: int = 12) -> None:
        self.length, self.max_steps = length, max_steps
        self.n_actions = 2
        self.obs_size = length

    def _obs(self) -> list[float]:
        return [1.0 if i == self.pos else 0.0 for i in range(self.length)]

    def reset(self) -> list[float]:
        self.pos, self.steps = random.randrange(self.length - 1), 0
        return self._obs()

    def sample_action(self) -> int:
        return random.randrange(self.n_actions)

    def step(self, action: int) -> tuple[list[float], float, bool]:
        self.pos = max(0, self.pos + (1 if action == 1 else -1))
        self.steps += 1
        at_goal = self.pos == self.length - 1
        return self._obs(), 1.0 if at_goal else -0.05, at_goal or self.steps >= self.max_steps


class ReplayBuffer:
    def __init__(self, capacity: int) -> None:
        self.buffer: deque = deque(maxlen=capacity)

    def __len__(self) -> int:
        return len(self.buffer)

    def append(self, experience: Experience) -> None:
        self.buffer.append(experience)

    def sample(self, batch_size: int) -> tuple[torch.Tensor, ...]:
        indices = random.sample(range(len(self.buffer)), batch_size)
        states, actions, rewards, dones, next_states = zip(*(self.buffer[i] for i in indices))
        return (torch.tensor(states), torch.tensor(actions), torch.tensor(rewards, dtype=torch.float32),
                torch.tensor(dones, dtype=torch.bool), torch.tensor(next_states))


class RLDataset(IterableDataset):
    """Each pass samples ``sample_size`` experiences from the buffer as it is then."""

    def __init__(self, buffer: ReplayBuffer, sample_size: int) -> None:
        self.buffer, self.sample_size = buffer, sample_size

    def __iter__(self) -> Iterator[tuple[torch.Tensor, ...]]:
        states, actions, rewards, dones, new_states = self.buffer.sample(self.sample_size)
        for i in range(len(dones)):
            yield states[i], actions[i], rewards[i], dones[i], new_states[i]


class QAgent:
    def __init__(self, env: Corridor, buffer: ReplayBuffer) -> None:
        self.env, self.buffer = env, buffer
        self.state = env.reset()

    def get_action(self, net: nn.Module, epsilon: float, device: torch.device) -> int:
        if random.random() < epsilon:
            return self.env.sample_action()
        q_values = net(torch.tensor([self.state], device=device))
        return int(q_values.argmax(1).item())

    @torch.no_grad()
    def play_step(self, net: nn.Module, epsilon: float, device: torch.device | str = "cpu") -> tuple[float, bool]:
        action = self.get_action(net, epsilon, torch.device(device))
        new_state, reward, done = self.env.step(action)
        self.buffer.append(Experience(self.state, action, reward, done, new_state))
        self.state = self.env.reset() if done else new_state
        return reward, done


class QNet(nn.Module):
    def __init__(self, obs_size: int, n_actions: int, hidden: int = 16) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(obs_size, hidden), nn.ReLU(), nn.Linear(hidden, n_actions))

    def forward(self, x):
        return self.net(x.float())


class DQNLightning(LightningModule):
    def __init__(self, batch_size: int = 8, replay_size: int = 64, warm_start_steps: int = 40, gamma: float = 0.9,
                 eps_start: float = 1.0, eps_end: float = 0.05, eps_last_frame: int = 10, sync_rate: int = 3,
                 lr: float = 1e-2, episode_length: int = 32) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.env = Corridor()
        self.net = QNet(self.env.obs_size, self.env.n_actions)
        self.target_net = QNet(self.env.obs_size, self.env.n_actions).requires_grad_(False)
        self.buffer = ReplayBuffer(replay_size)
        self.agent = QAgent(self.env, self.buffer)
        self.total_reward = 0.0
        self.episode_reward = 0.0
        self.populate(warm_start_steps)

    def populate(self, steps: int) -> None:
        for _ in range(steps):
            self.agent.play_step(self.net, epsilon=1.0)

    def forward(self, x):
        return self.net(x)

    def dqn_mse_loss(self, batch) -> torch.Tensor:
        states, actions, rewards, dones, next_states = batch
        state_action_values = self.net(states).gather(1, actions.unsqueeze(-1)).squeeze(-1)
        with torch.no_grad():
            next_state_values = self.target_net(next_states).max(1)[0]
            next_state_values[dones] = 0.0
        return nn.MSELoss()(state_action_values, next_state_values * self.hparams.gamma + rewards)

    def training_step(self, batch, nb_batch):
        hp = self.hparams
        epsilon = max(hp.eps_end, hp.eps_start - self.global_step / hp.eps_last_frame)
        reward, done = self.agent.play_step(self.net, epsilon, self.device)
        self.episode_reward += reward
        loss = self.dqn_mse_loss(batch)
        if done:
            self.total_reward, self.episode_reward = self.episode_reward, 0.0
        if self.global_step % hp.sync_rate == 0:
            self.target_net.load_state_dict(self.net.state_dict())
        self.log_dict({"reward": reward, "train_loss": loss})
        self.log("total_reward", self.total_reward, prog_bar=True)
        return loss

    def configure_optimizers(self):
        return torch.optim.Adam(self.net.parameters(), lr=self.hparams.lr)

    def train_dataloader(self):
        return DataLoader(RLDataset(self.buffer, self.hparams.episode_length), batch_size=self.hparams.batch_size)


def dqn_program(trainer_kw: dict[str, Any], world_size: int) -> dict[str, Any]:
    seed_everything(0)
    model = DQNLightning()  # its warm-up draws from Python's generator before fit
    trainer = Trainer(max_epochs=3, **trainer_kw)
    trainer.fit(model)
    return {"model": model, "trainer": trainer, "metrics": ["train_loss", "total_reward"],
            "buffer_rewards": sum(e.reward for e in model.buffer.buffer)}


# ---------------------------------------------------------------------------- demo Transformer language model
class TokenBlocks(Dataset):
    """(input, target) blocks of a seeded token stream; ``__getitem__`` masks a token at random (an augmentation)."""

    def __init__(self, vocab: int = 24, blocks: int = 48, block: int = 8) -> None:
        g = torch.Generator().manual_seed(11)
        stream = torch.randint(1, vocab, (blocks * block + 1,), generator=g)
        self.inputs, self.targets = stream[:-1].view(blocks, block), stream[1:].view(blocks, block)
        self.vocab_size = vocab

    def __len__(self) -> int:
        return len(self.inputs)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        tokens = self.inputs[index].clone()
        tokens[torch.randint(len(tokens), ())] = 0  # 0: the mask token
        return tokens, self.targets[index]


class LanguageModel(LightningModule):
    def __init__(self, vocab_size: int):
        super().__init__()
        self.model = Transformer(vocab_size=vocab_size, ninp=16, nhead=2, nhid=32, nlayers=1)

    def training_step(self, batch, batch_idx):
        inputs, target = batch
        loss = F.nll_loss(self.model(inputs, target), target.view(-1))
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch, batch_idx):
        inputs, target = batch
        self.log("val_loss", F.nll_loss(self.model(inputs, target), target.view(-1)), prog_bar=True)

    def test_step(self, batch, batch_idx):
        inputs, target = batch
        self.log("test_loss", F.nll_loss(self.model(inputs, target), target.view(-1)))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def language_model_program(trainer_kw: dict[str, Any], world_size: int) -> dict[str, Any]:
    seed_everything(42)
    dataset = TokenBlocks()
    n = len(dataset)
    train_set, val_set, test_set = random_split(dataset, [n - 16, 8, 8])
    train_loader = DataLoader(train_set, batch_size=4, shuffle=True)
    val_loader = DataLoader(val_set, batch_size=4)
    test_loader = DataLoader(test_set, batch_size=4)
    model = LanguageModel(vocab_size=dataset.vocab_size)
    kw = {**trainer_kw, "num_sanity_val_steps": 2}  # the example keeps the default sanity check
    trainer = Trainer(gradient_clip_val=0.25, max_epochs=2, limit_train_batches=3, **kw)
    trainer.fit(model, train_loader, val_loader)
    val_loss = float(trainer.callback_metrics["val_loss"])
    tested = trainer.test(model, test_loader, verbose=False)
    return {"model": model, "trainer": trainer, "metrics": [], "val_loss": val_loss,
            "test_loss": tested[0]["test_loss"], "rng_after": torch.rand(2)}


# ---------------------------------------------------------------------------- Fabric k-fold cross-validation
class FoldNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3)
        self.dropout1 = nn.Dropout(0.25)
        self.fc1 = nn.Linear(4 * 3 * 3, 16)
        self.dropout2 = nn.Dropout(0.5)
        self.fc2 = nn.Linear(16, 3)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv(x)), 2)
        x = self.dropout1(torch.flatten(x, 1))
        x = self.dropout2(F.relu(self.fc1(x)))
        return F.log_softmax(self.fc2(x), dim=1)


def kfold_split(n: int, folds: int) -> list[tuple[list[int], list[int]]]:
    """Contiguous folds in order (as scikit-learn's KFold without shuffling): (train indices, validation indices)."""
    bounds = [n * k // folds for k in range(folds + 1)]
    return [([i for i in range(n) if not bounds[k] <= i < bounds[k + 1]], list(range(bounds[k], bounds[k + 1])))
            for k in range(folds)]


def train_fold(fabric: Fabric, model, loader, optimizer) -> None:
    model.train()
    for data, target in loader:  # no .to(device): the loader from setup_dataloaders moves the batches
        optimizer.zero_grad()
        fabric.backward(F.nll_loss(model(data), target))
        optimizer.step()


def validate_fold(fabric: Fabric, model, loader, size: int, acc_metric) -> tuple[float, float]:
    model.eval()
    loss = 0.0
    with torch.no_grad():
        for data, target in loader:
            output = model(data)
            loss += F.nll_loss(output, target, reduction="sum").item()
            acc_metric.update(output, target)
    mean_loss = float(fabric.all_gather(loss).sum()) / size  # the sum over the ranks' parts of the fold
    return mean_loss, float(acc_metric.compute())


def kfold_fabric(fabric: Fabric, root: str) -> dict[str, Any]:
    from torchmetrics.classification import Accuracy

    seed_everything(1)
    g = torch.Generator().manual_seed(12)
    images = torch.randn(48, 1, 8, 8, generator=g)
    labels = (images[:, 0, :4].mean((1, 2)) > 0).long() + (images[:, 0, 4:].mean((1, 2)) > 0.2).long()
    dataset = TensorDataset(images, labels)
    splits = kfold_split(len(dataset), 3)
    models = [FoldNet() for _ in splits]
    optimizers = [torch.optim.Adadelta(m.parameters(), lr=1.0) for m in models]
    for i in range(len(splits)):
        models[i], optimizers[i] = fabric.setup(models[i], optimizers[i])
    acc_metric = Accuracy(task="multiclass", num_classes=3).to(fabric.device)
    epoch_accuracies, val_losses = [], []
    for _epoch in range(2):
        epoch_acc = 0.0
        for fold, (train_ids, val_ids) in enumerate(splits):
            train_loader = DataLoader(dataset, batch_size=4, sampler=SubsetRandomSampler(train_ids))
            val_loader = DataLoader(dataset, batch_size=4, sampler=SubsetRandomSampler(val_ids))
            train_loader, val_loader = fabric.setup_dataloaders(train_loader, val_loader)
            train_fold(fabric, models[fold], train_loader, optimizers[fold])
            loss, accuracy = validate_fold(fabric, models[fold], val_loader, len(val_ids), acc_metric)
            val_losses.append(loss)
            epoch_acc += accuracy
            acc_metric.reset()
        epoch_accuracies.append(epoch_acc / len(splits))
    weights = {f"fold{i}.{k}": v for i, m in enumerate(models) for k, v in full_weights(m).items()}
    return {"weights": weights, "epoch_accuracies": epoch_accuracies, "val_losses": val_losses}


TRAINER_PROGRAMS = {"dqn": dqn_program, "language_model": language_model_program}
FLEET_PROGRAMS = {"kfold": kfold_fabric}
