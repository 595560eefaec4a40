"""Typed errors of the ABI. Each message names the problem and the fix."""


class PortkitError(Exception):
    """Base of every error portkit raises on purpose."""


class BackendUnavailable(PortkitError):
    """A backend cannot run here: its driver, device or Python package is missing."""

    def __init__(self, reason: str, fix: str = ""):
        self.reason, self.fix = reason, fix
        super().__init__(f"{reason}; fix: {fix}" if fix else reason)


class CompileError(PortkitError):
    """The backend's compiler rejected a rendered kernel; carries the source and the log."""

    def __init__(self, message: str, source: str = "", log: str = ""):
        self.source, self.log = source, log
        super().__init__(f"{message}\n{log}".rstrip())


class UnsupportedDType(PortkitError):
    """A dtype that the ABI or the chosen backend does not have."""


class InvalidKernel(PortkitError):
    """An ABI kernel that breaks a rule of the IR; the message names the node."""


class CapabilityError(PortkitError):
    """A backend declared capabilities that the ABI cannot work with."""
