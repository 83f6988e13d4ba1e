"""What a continuous HF step's logits become (worker.hf.continuous): greedy tokens with EOS banned (as
generate()'s min_new_tokens does, so every row gets exactly its output_len tokens), appended to their rows
and written into the step's StepOutput, each stamped when it reached the host."""
from batchlab.worker.backend import StepOutput
from batchlab.worker.hf.chunks import Live


def eos_ids(model, tokenizer) -> list[int]:
    """The ids generate() bans under min_new_tokens (generation config's EOS), else the tokenizer's EOS."""
    ids = model.generation_config.eos_token_id
    if ids is None:
        ids = tokenizer.eos_token_id
    if ids is None:
        return []
    return [int(i) for i in ids] if isinstance(ids, (list, tuple)) else [int(ids)]


def pick(eos, logits):
    """Greedy next tokens from logits [N, 1, V], EOS banned since output lengths are exact: (on the
    device [N], on the host)."""
    scores = logits[:, -1]  # [N, V]
    if eos.numel():
        scores = scores.index_fill(-1, eos, float("-inf"))
    tokens = scores.argmax(-1)  # [N]
    return tokens, tokens.tolist()  # the host read (a CUDA sync): the tokens exist from here


def emit(lives: list[Live], tokens: list[int], t: float, out: StepOutput) -> None:
    """Append each row's token, stamped `t` (when it reached the host), and note rows now done."""
    for lv, token in zip(lives, tokens):
        lv.context.append(token)
        lv.generated += 1
        out.request_ids.append(lv.row.request_id)
        out.token_ids.append(token)
        out.times.append(t)
        if lv.remaining() <= 0:
            out.finished.append(lv.row.request_id)


def filled(lives: list[Live], counts: list[int], out: StepOutput) -> list[Live]:
    """Count the chunks that ran; the rows now fully prefilled (the oldest: only the last chunk can be
    partial)."""
    for lv, n in zip(lives, counts):
        lv.filled += n
    out.prefill_tokens = sum(counts)
    return [lv for lv in lives if not lv.unfilled()]
