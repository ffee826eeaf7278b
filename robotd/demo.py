"""The shipped policies under their public names: `robotd serve robotd.demo:DotFollower`."""

from robotd.worker.demo import DotFollower

__all__ = ["DotFollower"]
