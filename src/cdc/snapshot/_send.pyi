"""Type stub of the compiled loop of a rendered JSON snapshot chunk (``_send.pyx``); see ``cdc.snapshot.send``."""

from cdc.snapshot.send import RenderedChunk

def send_rendered(chunk: RenderedChunk) -> int: ...
