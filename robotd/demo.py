"""The shipped policies under their public names: `robotd serve robotd.demo:DotFollower`,
`robotd serve robotd.demo:Wave` (the exercise policy of real arms)."""

from robotd.worker.demo import DotFollower
from robotd.worker.wave import Wave

__all__ = ["DotFollower", "Wave"]
