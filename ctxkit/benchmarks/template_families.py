"""The stock chat templates TRL ships, each with a tokenizer that holds the special tokens it uses.

TRL keeps the chat templates of ~36 model families inside its package (`trl/chat_templates/*.jinja`,
each stock template beside a `_training` variant with `{% generation %}` markers where it has one). They
are read from the installed `trl` with `importlib.resources` (`stock_templates`, `template_text`); nothing
is copied into ctxkit.

`FAMILIES` is the explicit table of what each template needs from a tokenizer: the named tokens it reads
(`bos_token`, `eos_token`) and the special-token texts its own text writes. `family_tokenizer` builds
that tokenizer from a base byte-level BPE (the shared Qwen2.5 tokenizer, whose vocabulary covers every
script the conversations use) by adding those texts as special tokens, and writes it as an ordinary
tokenizer folder that both `ctxkit.load_tokenizer` and `transformers.AutoTokenizer` read, so ctxkit
and `apply_chat_template` tokenize with the same files. The ids are not the real model's ids: what is
tested is the template logic and the token boundaries its special tokens make.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path

from ctxkit.errors import ConfigError

TRAINING_SUFFIX = "_training"
"""A stock template `<name>.jinja` has its `{% generation %}`-marked variant in `<name>_training.jinja`."""
BASE_TOKENIZER = "qwen2.5-instruct"
"""The shared tokenizer (under `<shared>/tokenizers/`) every family's tokenizer is built from."""

_LLAMA3 = ("<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>")
_DEEPSEEK = ("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>",
             "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>",
             "<｜tool▁outputs▁begin｜>", "<｜tool▁outputs▁end｜>", "<｜tool▁output▁begin｜>", "<｜tool▁output▁end｜>",
             "<｜tool▁sep｜>", "<think>", "</think>")
_GEMMA4 = ("<bos>", "<eos>", "<|turn>", "<turn|>", "<|channel>", "<channel|>", "<|think|>", "<|tool>", "<tool|>",
           "<|tool_call>", "<tool_call|>", "<|tool_response>", "<tool_response|>", '<|"|>', "<|image|>", "<|audio|>",
           "<|video|>")
_CHATML = ("<|im_start|>", "<|im_end|>")
_THINK = ("<think>", "</think>")
_QWEN_VL = ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>")
_COHERE = ("<BOS_TOKEN>", "<|START_OF_TURN_TOKEN|>", "<|END_OF_TURN_TOKEN|>", "<|SYSTEM_TOKEN|>", "<|USER_TOKEN|>",
           "<|CHATBOT_TOKEN|>")
_PHI3 = ("<s>", "<|endoftext|>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>")


@dataclass(frozen=True)
class FamilySpec:
    """What one stock template needs from a tokenizer, and which conversations it takes."""

    bos: str | None
    """`bos_token` the template reads (None: the template reads none)."""
    eos: str
    """`eos_token` (also the tokenizer's named end of sequence)."""
    specials: tuple[str, ...]
    """Special-token texts the template writes, added to the base tokenizer as special tokens."""
    tools: bool = True
    """The template renders tool schemas, calls and results (False: conversations without tools)."""
    system: bool = True
    """The template accepts a system message."""


FAMILIES: dict[str, FamilySpec] = {
    "cohere": FamilySpec("<BOS_TOKEN>", "<|END_OF_TURN_TOKEN|>", _COHERE),
    "cohere2": FamilySpec("<BOS_TOKEN>", "<|END_OF_TURN_TOKEN|>", _COHERE + ("<|START_RESPONSE|>", "<|END_RESPONSE|>")),
    "deepseek_r1_distill": FamilySpec("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", _DEEPSEEK),
    "deepseekv3": FamilySpec("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", _DEEPSEEK),
    "diffusion_gemma": FamilySpec("<bos>", "<eos>", _GEMMA4),
    "gemma": FamilySpec("<bos>", "<eos>", ("<bos>", "<eos>", "<start_of_turn>", "<end_of_turn>"), tools=False,
                        system=False),
    "gemma3": FamilySpec("<bos>", "<eos>", ("<bos>", "<eos>", "<start_of_turn>", "<end_of_turn>", "<start_of_image>"),
                         tools=False),
    "gemma4": FamilySpec("<bos>", "<eos>", _GEMMA4),
    "gemma4_v2": FamilySpec("<bos>", "<eos>", _GEMMA4),
    "gemma4_v3": FamilySpec("<bos>", "<eos>", _GEMMA4),
    "gemma4_v4": FamilySpec("<bos>", "<eos>", _GEMMA4),
    "gemma4_v5": FamilySpec("<bos>", "<eos>", _GEMMA4),
    "glm4moe": FamilySpec(None, "<|endoftext|>", ("[gMASK]", "<sop>", "<|system|>", "<|user|>", "<|assistant|>",
                                                  "<|observation|>", "<|endoftext|>") + _THINK),
    "gptoss": FamilySpec("<|startoftext|>", "<|return|>", ("<|startoftext|>", "<|start|>", "<|end|>", "<|message|>",
                                                            "<|channel|>", "<|call|>", "<|return|>", "<|constrain|>")),
    "idefics3": FamilySpec("<|begin_of_text|>", "<end_of_utterance>", ("<|begin_of_text|>", "<end_of_utterance>",
                                                                       "<image>"), tools=False),
    "lfm2": FamilySpec("<|startoftext|>", "<|im_end|>", ("<|startoftext|>",) + _CHATML + (
        "<|tool_list_start|>", "<|tool_list_end|>", "<|tool_response_start|>", "<|tool_response_end|>")),
    "lfm2_v2": FamilySpec("<|startoftext|>", "<|im_end|>", ("<|startoftext|>",) + _CHATML + (
        "<|tool_list_start|>", "<|tool_list_end|>", "<|tool_response_start|>", "<|tool_response_end|>",
        "<|tool_call_start|>", "<|tool_call_end|>")),
    "lfm2_2_5": FamilySpec("<|startoftext|>", "<|im_end|>", ("<|startoftext|>",) + _CHATML + (
        "<|tool_call_start|>", "<|tool_call_end|>", "<image>") + _THINK),
    "lfm2_2_5_v2": FamilySpec("<|startoftext|>", "<|im_end|>", ("<|startoftext|>",) + _CHATML + (
        "<|tool_call_start|>", "<|tool_call_end|>", "<image>") + _THINK),
    "lfm2_2_5_vl": FamilySpec("<|startoftext|>", "<|im_end|>", ("<|startoftext|>",) + _CHATML + (
        "<|tool_call_start|>", "<|tool_call_end|>", "<image>") + _THINK),
    "llama3": FamilySpec("<|begin_of_text|>", "<|eot_id|>", _LLAMA3, tools=False),
    "llama3_1": FamilySpec("<|begin_of_text|>", "<|eot_id|>", _LLAMA3 + ("<|eom_id|>", "<|python_tag|>")),
    "llama3_2": FamilySpec("<|begin_of_text|>", "<|eot_id|>", _LLAMA3 + ("<|eom_id|>", "<|python_tag|>")),
    "llava_next": FamilySpec("<s>", "</s>", ("<s>", "</s>", "[INST]", "[/INST]", "<image>"), tools=False),
    "muse_glimmer": FamilySpec("<|begin_of_text|>", "<|eot|>", ("<|begin_of_text|>", "<|start|>", "<|message|>",
                                                                "<|eot|>", "<|eom|>", "<|patch|>", "<|video|>")),
    "nemotron_3_5_lightning": FamilySpec("<s>", "<|im_end|>", ("<s>",) + _CHATML + _THINK),
    "nemotron_3_nano": FamilySpec("<s>", "<|im_end|>", ("<s>",) + _CHATML + _THINK),
    "nemotron_3_super": FamilySpec("<s>", "<|im_end|>", ("<s>",) + _CHATML + _THINK),
    "nemotron_3_ultra": FamilySpec("<s>", "<|im_end|>", ("<s>",) + _CHATML + _THINK),
    "phi3": FamilySpec("<s>", "<|endoftext|>", _PHI3, tools=False),
    "phi3_5": FamilySpec("<s>", "<|endoftext|>", _PHI3, tools=False),
    "qwen2_5": FamilySpec(None, "<|im_end|>", _CHATML),
    "qwen2_5_vl": FamilySpec(None, "<|im_end|>", _CHATML + _QWEN_VL),
    "qwen3": FamilySpec(None, "<|im_end|>", _CHATML + _THINK),
    "qwen3_5_nothink": FamilySpec(None, "<|im_end|>", _CHATML + _THINK + _QWEN_VL),
    "qwen3_5_think": FamilySpec(None, "<|im_end|>", _CHATML + _THINK + _QWEN_VL),
    "qwen3_6": FamilySpec(None, "<|im_end|>", _CHATML + _THINK + _QWEN_VL),
    "qwen3_8": FamilySpec(None, "<|im_end|>", _CHATML + _THINK + _QWEN_VL),
    "qwen3_instruct_2507": FamilySpec(None, "<|im_end|>", _CHATML),
    "qwen3_vl": FamilySpec(None, "<|im_end|>", _CHATML + _QWEN_VL),
    "smolvlm": FamilySpec("<|im_start|>", "<end_of_utterance>", ("<|im_start|>", "<end_of_utterance>", "<image>"),
                          tools=False),
}
"""Stock template name (the file stem in `trl/chat_templates`) -> what it needs (see `FamilySpec`)."""


def templates_dir():
    """The `chat_templates` folder of the installed `trl` (a `Traversable`); `ConfigError` when trl is absent."""
    from importlib.resources import files  # lazy: only the suite and its report read TRL's templates

    try:
        return files("trl").joinpath("chat_templates")
    except ModuleNotFoundError as exc:
        raise ConfigError("the template-family suite needs trl installed (pip install -e '.[train]')") from exc


def stock_templates() -> list[str]:
    """Names of every stock template the installed trl ships (its `_training` variants excluded), sorted."""
    names = [p.name[: -len(".jinja")] for p in templates_dir().iterdir() if p.name.endswith(".jinja")]
    return sorted(n for n in names if not n.endswith(TRAINING_SUFFIX))


def template_text(name: str) -> str:
    """The text of TRL's template `name` (`<name>.jinja`); `ConfigError` naming it when trl ships none."""
    path = templates_dir().joinpath(f"{name}.jinja")
    if not path.is_file():
        raise ConfigError(f"trl ships no chat template {name!r} (looked for {name}.jinja in trl/chat_templates)")
    return path.read_text(encoding="utf-8")


def training_name(name: str) -> str | None:
    """The `_training` variant of stock template `name`, or None when trl ships none for it."""
    candidate = name + TRAINING_SUFFIX
    return candidate if templates_dir().joinpath(f"{candidate}.jinja").is_file() else None


def family_spec(name: str) -> FamilySpec:
    """The `FAMILIES` entry of `name`; `ConfigError` naming the missing family (a template trl added)."""
    spec = FAMILIES.get(name)
    if spec is None:
        raise ConfigError(f"chat template {name!r} from trl has no entry in FAMILIES "
                          "(ctxkit.benchmarks.template_families): say which special tokens it uses")
    return spec


@functools.lru_cache(maxsize=2)
def _base_json(folder: str) -> str:
    """The base tokenizer of `folder` serialized (read once: building it from vocab and merges takes seconds)."""
    from ctxkit.text.tokenizer.hf_files import read_tokenizer_folder  # lazy: L1 part read only here

    files = read_tokenizer_folder(folder)
    if files is None:  # pragma: no cover - the shared Qwen2.5 folder is read without transformers
        raise ConfigError(f"cannot read the base tokenizer {folder} without transformers")
    return files.backend.to_str()


def family_tokenizer(name: str, shared: Path, out: Path, added: tuple[str, ...] = ()) -> Path:
    """Write the tokenizer folder of family `name` under `out` (the base BPE from `shared`/tokenizers plus the
    family's special tokens; its chat template is TRL's stock template) and return it. Written once per
    folder: an existing folder is reused. `added`: further texts added as ordinary (non-special) added
    tokens, as the real models hold `<tool_response>` (a caller passing them uses an `out` of its own)."""
    from tokenizers import AddedToken, Tokenizer  # lazy: tokenizers loads only for the suite

    spec = family_spec(name)
    folder = out / name
    if (folder / "tokenizer_config.json").is_file():
        return folder
    backend = Tokenizer.from_str(_base_json(str(shared / "tokenizers" / BASE_TOKENIZER)))
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in spec.specials])
    if added:
        backend.add_tokens([AddedToken(t, special=False, normalized=False) for t in added])
    folder.mkdir(parents=True, exist_ok=True)
    backend.save(str(folder / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": spec.bos, "eos_token": spec.eos,
              "pad_token": None, "unk_token": None, "chat_template": template_text(name),
              "add_bos_token": False, "add_eos_token": False, "clean_up_tokenization_spaces": False}
    (folder / "tokenizer_config.json").write_text(json.dumps(config, ensure_ascii=False), encoding="utf-8")
    for extra in filter(None, [training_name(name)]):
        (folder / f"{extra}.jinja").write_text(template_text(extra), encoding="utf-8")
    return folder


__all__ = ["BASE_TOKENIZER", "FAMILIES", "FamilySpec", "TRAINING_SUFFIX", "family_spec", "family_tokenizer",
           "stock_templates", "template_text", "templates_dir", "training_name"]
