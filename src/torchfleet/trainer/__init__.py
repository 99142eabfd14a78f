"""The Trainer, its loops, self.log results and callbacks."""
