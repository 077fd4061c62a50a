"""The independent reference of the in-rank torch optimizer tests: one process training plain
torch (no hvdplus at all) on whole batches."""

__all__ = ["train_plainly"]


def train_plainly(model, make_optimizer, loss_fn, batches):
    """`model` trained by `make_optimizer(model.parameters())` on each (x, y) of `batches` in turn,
    one step each, with `loss_fn(model, x, y)`; returns the model."""
    optimizer = make_optimizer(model.parameters())
    for x, y in batches:
        optimizer.zero_grad()
        loss_fn(model, x, y).backward()
        optimizer.step()
    return model
