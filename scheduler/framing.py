"""The scheduler's launches as Dispatch frames: runs of one worker's launches in one message, split
where a message would pass the frame limit (a peer drops the connection of a sender that passes it)."""
from batchlab.protocol import Dispatch, encode
from batchlab.protocol.codec import MAX_MESSAGE_BYTES
from batchlab.scheduler.launch import Launch


def group_launches(launches: list[Launch]) -> list[list[Launch]]:
    """Runs of launches one Dispatch can carry: the same worker and reason, consecutive batch ids (the
    core numbers a continuous worker's one-request batches of a pass so)."""
    groups: list[list[Launch]] = []
    for launch in launches:
        last = groups[-1][-1] if groups else None
        if (last is not None and last.worker_id == launch.worker_id and last.reason == launch.reason
                and launch.batch_id == last.batch_id + 1):
            groups[-1].append(launch)
        else:
            groups.append([launch])
    return groups


def dispatch_of(group: list[Launch], t: float) -> Dispatch:
    """One message for a run of launches to one worker (group_launches), scheduled at `t`."""
    if len(group) == 1:
        return group[0].dispatch(t)
    return Dispatch(group[0].batch_id, t, group[0].reason, [r.row() for launch in group for r in launch.requests],
                    [len(launch.requests) for launch in group])


def dispatch_frames(group: list[Launch], t: float, max_bytes: int = MAX_MESSAGE_BYTES
                    ) -> tuple[list[tuple[list[Launch], bytes]], list[tuple[Launch, str]]]:
    """([(launches, their frame)], [(launch, why it cannot be sent)]): a run halved until each frame fits;
    a launch (one batch) whose message alone passes the limit is never split (a batch is one decision)."""
    frame = encode(dispatch_of(group, t))
    if len(frame) <= max_bytes:
        return [(group, frame)], []
    if len(group) == 1:
        rows = len(group[0].requests)
        return [], [(group[0], f"dispatch of {rows} rows is {len(frame)} bytes, over the {max_bytes}-byte "
                               f"frame limit")]
    half = len(group) // 2
    head, tail = dispatch_frames(group[:half], t, max_bytes), dispatch_frames(group[half:], t, max_bytes)
    return head[0] + tail[0], head[1] + tail[1]
