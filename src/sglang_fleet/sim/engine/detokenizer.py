"""A simulated `sglang::detokenizer`: present, titled like SGLang's, dies with its parent.

With the `detokenizer_crash` fault the main process tells it (SIGUSR1) when the first batch
after ready reaches it: it fails as 0.5.23's run_detokenizer_process does
(managers/detokenizer_manager.py): "DetokenizerManager hit an exception: <traceback>", then
SIGQUIT to its parent, whose handler takes the whole tree down. With the `detokenizer_hang`
fault it is told so by SIGUSR2 and deadlocks in the batch's decode, in the frames of
sim/srt/managers/detokenizer_manager.py, silently, for good.
"""

from __future__ import annotations

import os
import signal
import sys

from setproctitle import setproctitle

from sglang_fleet.sim.engine import failures
from sglang_fleet.sim.engine.runtime import log
from sglang_fleet.sim.engine.scheduler import die_with_parent
from sglang_fleet.sim.srt.managers.detokenizer_manager import DetokenizerManager

# run_detokenizer_process -> event_loop -> handle_batch_token_id_out ->
# _decode_batch_token_id_output, whose lookup of a request's decode status fails.
_DETOKENIZER = "sglang/srt/managers/detokenizer_manager.py"
FRAMES = [
    (_DETOKENIZER, 561, "run_detokenizer_process", "manager.event_loop()"),
    (_DETOKENIZER, 189, "event_loop", "output = self._request_dispatcher(recv_obj)"),
    (_DETOKENIZER, 462, "handle_batch_token_id_out",
     "self._decode_batch_token_id_output(recv_obj)"),
]
LOOKUP = (_DETOKENIZER, 383, "_decode_batch_token_id_output", "s = self.decode_status[rid]")
RAISE = (_DETOKENIZER, 385, "_decode_batch_token_id_output", "raise RuntimeError(")
DETOKENIZER_MAX_STATES = 1 << 16  # SGLANG_DETOKENIZER_MAX_STATES's default


def decode_status_lost(rid: str) -> str:
    """The traceback SGLang prints when a request's decode status was evicted."""
    message = (f"Decode status not found for request {rid}. It may be due to the request being "
               f"evicted from the decode status due to memory pressure. Please increase the "
               f"maximum number of requests by setting the SGLANG_DETOKENIZER_MAX_STATES "
               f"environment variable to a bigger value than the default value. The current "
               f"value is {DETOKENIZER_MAX_STATES}. For more details, see: "
               f"https://github.com/sgl-project/sglang/issues/2812")
    first = failures.frames_traceback([*FRAMES, LOOKUP], KeyError(rid))
    second = failures.frames_traceback([*FRAMES, RAISE], RuntimeError(message))
    return (f"{first}\nDuring handling of the above exception, another exception "
            f"occurred:\n\n{second}")


def main() -> None:
    setproctitle("sglang::detokenizer")
    parent = int(sys.argv[1])
    die_with_parent(parent)

    def fail() -> None:
        log(f"DetokenizerManager hit an exception: {decode_status_lost(os.urandom(16).hex())}")
        os.kill(parent, signal.SIGQUIT)

    # Taken in the main thread's own frames (not a handler's), as the real event loop's.
    told = {signal.SIGUSR1, signal.SIGUSR2}
    signal.pthread_sigmask(signal.SIG_BLOCK, told)
    while True:
        if signal.sigwait(told) == signal.SIGUSR1:
            fail()
        else:
            DetokenizerManager().handle_batch_token_id_out()


if __name__ == "__main__":
    main()
