"""A launch as Dispatch frames: one, or its batches split across several where one message would pass
the frame limit (a peer drops the connection of a sender that passes it)."""
from batchlab.protocol import encode
from batchlab.protocol.codec import MAX_MESSAGE_BYTES
from batchlab.scheduler.launch import Launch


def dispatch_frames(launch: Launch, t: float, max_bytes: int = MAX_MESSAGE_BYTES
                    ) -> tuple[list[tuple[Launch, bytes]], list[tuple[Launch, str]]]:
    """([(launch or part of it, its frame)], [(part, why it cannot be sent)]): halved at batch boundaries
    until each frame fits; a batch whose message alone passes the limit is never split (it is one decision)."""
    frame = encode(launch.dispatch(t))
    if len(frame) <= max_bytes:
        return [(launch, frame)], []
    parts = launch.halves()
    if parts is None:
        return [], [(launch, f"dispatch of {len(launch.rows)} rows is {len(frame)} bytes, over the "
                             f"{max_bytes}-byte frame limit")]
    head, tail = (dispatch_frames(part, t, max_bytes) for part in parts)
    return head[0] + tail[0], head[1] + tail[1]
