"""The one preflight: a run's settings checked before any process starts, beyond what the settings models check
alone. The whole config (checked_config: its strategy resolved and asked once, a batch within the frame limit,
naive's batch within its clients, a trace readable, the lengths), then what a run needs: the sim preset, a plugin
backend, the model (a local folder, a built-in name, or in the local Hugging Face cache; else the Hub must answer
at once), the key folder, the run's socket paths (TMPDIR), a --save-result file. One line each (ConfigError)."""
import os
import tempfile
from pathlib import Path

from batchlab.protocol.setting_groups import BACKENDS
from batchlab.protocol.errors import term
from batchlab.protocol.modes import BatchingMode
from batchlab.protocol.settings import ConfigError, RunConfig, build_config, said

HUB_TIMEOUT_S = 1.5  # one metadata request, never the 50 s of retries a from_pretrained would spend
PATH_PREFIXES = ("/", "./", "../", "~")
# An ipc:// socket's path must fit sockaddr_un.sun_path (108 bytes on Linux) with its closing NUL.
IPC_PATH_MAX_BYTES = 107
KEY_FILES = ("server.key", "server.key_secret", "client.key", "client.key_secret")  # keys generate's


def checked_config(file_values: dict, overrides: dict) -> RunConfig:
    """build_config, then the strategy resolved and its decide called once on an empty queue (an unknown name,
    a bad parameter or a decide that raises is a ConfigError);
    its strategy_args are kept typed (--strategy-arg gives text)."""
    from batchlab.scheduler.strategies import check_decides, resolve

    cfg = build_config(file_values, overrides)
    strategy = resolve(cfg)
    check_decides(strategy)  # a class without decide, or one that raises on its first look: before any process
    cfg.strategy_args = strategy.args
    for name in ("prompt_lengths", "output_lengths"):  # one text form, whatever the YAML held
        setattr(cfg, name, lengths_text(name, getattr(cfg, name)))
    _check_frame(strategy.rows if strategy.mode == BatchingMode.STATIC else 1, cfg.max_prompt_len)
    if 0 < cfg.concurrency < strategy.rows and strategy.name == "naive":  # its batches would never fill
        raise ConfigError(f"naive launches exactly {strategy.rows} requests at once, and {cfg.concurrency} "
                          f"closed-loop clients never have that many out: use {said('batch_size')} ≤ "
                          f"{said('concurrency')}")
    _check_trace(cfg.dataset)
    return cfg


def _check_frame(rows: int, max_prompt_len: int) -> None:
    """ConfigError when one batch's Dispatch could pass the frame limit: a static batch is one message
    of `rows` prompts of up to max_prompt_len token ids (4 bytes each); a continuous one, one request."""
    from batchlab.protocol.codec import MAX_MESSAGE_BYTES

    size = rows * (max_prompt_len * 4 + ROW_OVERHEAD_BYTES)
    if size > MAX_MESSAGE_BYTES:
        raise ConfigError(f"a batch of {rows} rows × {max_prompt_len} prompt tokens is up to {size / 2**20:.1f} MiB "
                          f"on the wire, over the {MAX_MESSAGE_BYTES / 2**20:g} MiB frame limit: lower the rows "
                          f"({said('batch_size')}, {said('max_batch_size')} or the strategy's) or "
                          f"{said('max_prompt_len')}")


ROW_OVERHEAD_BYTES = 32  # a Dispatch row's id, lengths and headers besides its token ids


def _check_trace(dataset: str) -> None:
    """A trace that cannot be used is a ConfigError now, before any folder or process (read once: cached)."""
    from batchlab.traffic.datasets import DatasetError
    from batchlab.traffic.traces import is_trace_dataset, load_trace

    if is_trace_dataset(dataset):
        try:
            load_trace(dataset)
        except DatasetError as exc:
            raise ConfigError(str(exc)) from None


def lengths_text(name: str, value: object) -> str:
    """A length setting (int, list, mapping or text) as the text traffic.lengths reads back; "" stays "";
    ConfigError naming the setting when it describes no lengths."""
    from batchlab.traffic.lengths import LengthSpec, parse_lengths

    if value in (None, ""):
        return ""
    try:
        return parse_lengths(value, LengthSpec(), name).text()
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def refuse_schedule_conflicts(given: dict, saved: dict) -> None:
    """ConfigError for the first option given whose value differs from the replayed schedule's (replay_config)."""
    for name, value in given.items():
        if name in ("prompt_lengths", "output_lengths"):
            value = lengths_text(name, value)
        if value != saved.get(name):
            raise ConfigError(f"{said(name, value)} conflicts with the replayed schedule "
                              f"({name} {value_text(saved.get(name))}); drop it or build a new schedule")


def value_text(value: object) -> str:
    """A setting's value as a message shows it (a float in %g)."""
    return f"{value:g}" if isinstance(value, float) else str(value)


def check_before_start(cfg: RunConfig) -> None:
    """ConfigError (one line) for a preset, plugin backend, model, key folder or socket folder that cannot
    work; nothing starts first."""
    if cfg.keys:
        check_keys(cfg.keys)
    if cfg.backend == "sim":
        check_preset(cfg.preset)
    if cfg.backend not in BACKENDS:  # a plugin: importable, a Backend, running the strategy's mode
        check_plugin_backend(cfg)
    # a model backend loads the model; traffic tokenizes real prompts with its tokenizer (an openai server's
    # model name is the server's business)
    if cfg.backend != "openai" and (cfg.backend in ("hf", "vllm") or cfg.dataset != "synthetic"):
        check_model(cfg.model)


def check_plugin_backend(cfg: RunConfig) -> None:
    """A plugin backend importable, a Backend running the strategy's mode, and its own check (Backend.check)
    passed in this process: anything that raises there is a ConfigError naming the class."""
    from batchlab.scheduler.strategies import resolve
    from batchlab.worker.factory import backend_class

    mode = resolve(cfg).mode
    cls = backend_class(cfg.backend, mode)
    try:
        cls.check(cfg, mode)
    except Exception as exc:
        why = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise ConfigError(f"backend {cfg.backend} ({cls.__module__}:{cls.__qualname__}) refused the settings: "
                          f"{type(exc).__name__}" + (f": {why}" if why else "")) from None


def check_launch(cfg: RunConfig, save_result: str | None = None) -> None:
    """What `batchlab run` needs beyond the settings: its sockets' folder, and where --save-result goes."""
    check_ipc_folder()
    if save_result:
        check_result_file(save_result)


def check_keys(folder: str) -> None:
    """The key folder holds what `batchlab keys generate` writes, readable as CurveZMQ certificates."""
    import zmq.auth

    path = Path(folder).expanduser()
    if not path.is_dir():
        raise ConfigError(f"{said('keys')} {folder}: no such folder (make one with `batchlab keys generate {folder}`)")
    missing = [name for name in (*KEY_FILES, "authorized") if not (path / name).exists()]
    if missing:
        raise ConfigError(f"{said('keys')} {folder} lacks {', '.join(missing)} (make the folder with `batchlab keys "
                          "generate DIR`)")
    for name in KEY_FILES:
        try:
            zmq.auth.load_certificate(path / name)
        except (OSError, ValueError) as exc:
            raise ConfigError(f"{said('keys')} {folder}: {name} is not a readable key ({exc})") from None


def check_ipc_folder() -> None:
    """The run's ipc:// sockets (in a temp folder: runner.procs.run_temp_folder) fit the OS's path limit."""
    from batchlab.runner.procs import TEMP_PREFIX, run_socket_paths

    longest = max(len(os.fsencode(p)) for p in run_socket_paths())
    if longest > IPC_PATH_MAX_BYTES:
        raise ConfigError(f"the temp folder {tempfile.gettempdir()} is too long for the run's sockets: their paths "
                          f"({TEMP_PREFIX}…/…sock inside it) would be {longest} bytes, over the OS's limit of "
                          f"{IPC_PATH_MAX_BYTES}; set TMPDIR to a shorter folder (e.g. /tmp)")


def check_result_file(path: str) -> None:
    """--save-result names a file that can be written: not a folder, in a folder that exists or can be
    made, where a file can be created (tried with a nameless temporary file)."""
    target = Path(path).expanduser()
    if target.is_dir():
        raise ConfigError(f"{term('--save-result', 'save_result')} {path} is a folder; name a file (e.g. "
                          f"{Path(path) / 'result.json'})")
    folder = target.parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    if not folder.is_dir():
        raise ConfigError(f"{term('--save-result', 'save_result')} {path}: {folder} is not a folder")
    try:
        tempfile.TemporaryFile(dir=folder).close()
    except OSError as exc:
        raise ConfigError(f"{term('--save-result', 'save_result')} {path}: no file can be created in {folder} "
                          f"({exc.strerror or exc})") from None


def check_preset(name: str) -> None:
    """The sim preset exists and reads as a step model."""
    from batchlab.worker.stepmodel import get_preset

    try:
        get_preset(name)
    except ValueError as exc:
        raise ConfigError(f"{said('preset')}: {exc}") from None


def check_model(name: str) -> None:
    """tiny-mistral and NAME:random are built locally; a path must exist; a Hub id must be in the local
    cache, or the Hub must say it exists within HUB_TIMEOUT_S."""
    from batchlab.models.archs import TINY_MISTRAL, random_arch

    if name == TINY_MISTRAL:
        return
    try:
        if random_arch(name) is not None:
            return
    except ValueError as exc:
        raise ConfigError(f"{said('model')}: {exc}") from None
    if Path(name).expanduser().exists():
        return
    if name.startswith(PATH_PREFIXES):
        raise ConfigError(f"{said('model')} {name}: no such folder")
    _check_hub_model(name)


def _check_hub_model(name: str) -> None:
    try:
        from huggingface_hub import constants, model_info, try_to_load_from_cache
        from huggingface_hub.errors import GatedRepoError, HFValidationError, RepositoryNotFoundError
    except ImportError:  # no Hub client: the backend's own loader reports what is wrong
        return
    try:
        if isinstance(try_to_load_from_cache(name, "config.json"), str):
            return
    except HFValidationError:
        raise ConfigError(f"--model {name!r} is neither a folder nor a valid Hugging Face model id") from None
    where = f"neither a local folder nor in the Hugging Face cache ({constants.HF_HUB_CACHE})"
    if constants.HF_HUB_OFFLINE or os.environ.get("TRANSFORMERS_OFFLINE") == "1":
        raise ConfigError(f"{said('model')} {name} is {where}, and the Hub is off (HF_HUB_OFFLINE)")
    try:
        model_info(name, timeout=HUB_TIMEOUT_S)
    except GatedRepoError:
        return  # it exists; the download needs a token, which the loader reports
    except RepositoryNotFoundError:
        raise ConfigError(f"{said('model')} {name} is {where}, and the Hub has no such model") from None
    except Exception as exc:  # no network, DNS, a timeout: all mean the weights cannot come
        raise ConfigError(f"{said('model')} {name} is {where}, and the Hub cannot be reached "
                          f"({type(exc).__name__}); download it first or give a local folder") from None
