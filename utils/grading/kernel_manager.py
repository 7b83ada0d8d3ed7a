"""The kernel manager of a grading kernel: how the kernel is started and what the grader's
client accepts from it.

The kernel is started through `utils/grading/containment.py` (it dies with the process that
started it) and `utils/grading/sandbox.py` (which applies `Limits`, and the bubblewrap
sandbox of `isolation`), with the output-bounding extension `kernel_output` loaded; the
client's sockets refuse any message over `Budget.message_mib` before reading it.
"""

from __future__ import annotations

import zmq
import zmq.asyncio
from jupyter_client.manager import AsyncKernelManager

from . import containment
from .isolation import Isolation
from .sandbox import Limits

__all__ = ["LimitedKernelManager"]


class LimitedKernelManager(AsyncKernelManager):
    """Starts the kernel through `utils/grading/containment.py` (the kernel dies with the
    process that started it) and `utils/grading/sandbox.py` (which applies `Limits`), with
    the output-bounding extension loaded."""

    limits: Limits = Limits()
    isolation: Isolation | None = None
    """The kernel's bubblewrap sandbox (`isolation.py`); None: not isolated."""

    def format_kernel_cmd(self, extra_arguments: list[str] | None = None) -> list[str]:
        if self.isolation is not None:  # after the connection file is written: handed to the kernel's uid
            self.isolation.prepare()
        return (containment.wrapper_args() + self.limits.wrapper_args(self.isolation)
                + super().format_kernel_cmd(extra_arguments)
                + ["--IPKernelApp.extensions=utils.grading.kernel_output"])

    max_message: int = 0
    """Largest message (bytes) the grader's client accepts from the kernel (`Budget.message_mib`); 0: any."""

    def client(self, **kwargs):
        """A client whose sockets refuse messages over `max_message` before reading them."""
        if not self.max_message or "context" in kwargs:
            return super().client(**kwargs)
        context = zmq.asyncio.Context()
        context.setsockopt(zmq.MAXMSGSIZE, self.max_message)
        client = super().client(context=context, **kwargs)
        client._created_context = True  # the client destroys it when its channels stop
        return client

    async def _async_cleanup_resources(self, restart: bool = False) -> None:
        await super()._async_cleanup_resources(restart=restart)
        if self.isolation is not None:  # a socket folder outside the scratch folder, if any
            self.isolation.cleanup()
