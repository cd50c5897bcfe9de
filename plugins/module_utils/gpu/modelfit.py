# -*- coding: utf-8 -*-
# Can this model run in this parallel layout on these GPUs? What SGLang and the model refuse
# only once the weights load (tens of minutes into a start on a 1T-parameter model), asked
# before anything starts: attention heads against attention TP, key/value heads against TP,
# experts against EP, layers against PP, and the weights each GPU holds against its memory.
# The controller asks it of a model it knows (sglang_fleet.known.models), the node check of the
# node's own config.json and checkpoint, the simulator of its stand-in model.
from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json
import os

GIB = float(1 << 30)
# SGLang's default --mem-fraction-static is (GPU memory - reserved) / GPU memory, 0.95 when it
# cannot read the GPU (sglang/srt/arg_groups/memory_hook.py, handle_gpu_memory_settings): no
# default goes above it, so a layout whose weights exceed it never fits.
DEFAULT_FRACTION_CEILING = 0.95

# Where SGLang itself refuses each layout, as its traceback would show it.
HEADS_ASSERT = {
    "MLA": "sglang/srt/models/deepseek_v2.py: assert num_heads % attn_tp_size == 0",
    "MHA": "sglang/srt/models/llama.py: assert self.total_num_heads % tp_size == 0",
}
KV_HEADS_ASSERT = ("sglang/srt/models/llama.py: assert self.total_num_kv_heads % tp_size == 0 "
                   "(or tp_size % self.total_num_kv_heads == 0 when TP exceeds the KV heads)")


def model_shape(config):
    """The parts of a config.json that decide which layouts load. Multimodal checkpoints nest
    the language model's config (Kimi-K2.5: text_config)."""
    text = config.get("text_config") or config.get("language_config") or config
    heads = text.get("num_attention_heads")
    experts = (text.get("n_routed_experts") or text.get("num_experts")
               or text.get("num_local_experts"))
    return {
        "architecture": (config.get("architectures") or [None])[0],
        # MLA models compress K/V into one latent (kv_lora_rank): no KV heads to split.
        "attention": "MLA" if text.get("kv_lora_rank") else "MHA",
        "num_attention_heads": heads,
        "num_key_value_heads": text.get("num_key_value_heads", heads),
        "num_hidden_layers": text.get("num_hidden_layers"),
        "n_routed_experts": experts,
    }


def read_model(model_dir):
    """(shape, checkpoint bytes) of a model folder on this machine, or None when it has no
    readable config.json (a hub id, or a folder the start checks refuse). Bytes come from the
    safetensors index's total_size, else the weight files' sizes; None when neither is there."""
    try:
        with open(os.path.join(model_dir, "config.json")) as f:
            config = json.load(f)
    except (OSError, IOError, ValueError):
        return None
    if not isinstance(config, dict):
        return None
    return model_shape(config), checkpoint_bytes(model_dir)


def checkpoint_bytes(model_dir):
    try:
        with open(os.path.join(model_dir, "model.safetensors.index.json")) as f:
            total = json.load(f).get("metadata", {}).get("total_size")
        if isinstance(total, int) and total > 0:
            return total
    except (OSError, IOError, ValueError, AttributeError):
        pass
    try:
        names = os.listdir(model_dir)
    except OSError:
        return None
    sizes = [os.path.getsize(os.path.join(model_dir, n)) for n in names
             if n.endswith((".safetensors", ".bin", ".pt")) and
             os.path.isfile(os.path.join(model_dir, n))]
    return sum(sizes) or None


def _divisors(n, most=64):
    return [d for d in range(1, min(n, most) + 1) if n % d == 0]


def _problem(variable, value, problem, fix):
    return {"variable": variable, "value": value, "problem": problem, "fix": fix}


def layout_problems(name, shape, layout):
    """What the model refuses of a layout {tp, pp, attn_dp, ep}: a list of problems, each
    naming the inventory variable, its value, SGLang's refusal and the fix."""
    out = []
    tp, pp = layout["tp"], layout["pp"]
    attn_dp, ep = layout.get("attn_dp") or 1, layout.get("ep") or 1
    heads, kv = shape.get("num_attention_heads"), shape.get("num_key_value_heads")
    attention = shape.get("attention") or "MHA"
    if tp % attn_dp:
        return out  # SGLang's own argument checks refuse it first, with their message
    attn_tp = tp // attn_dp
    width = "TP %d" % tp if attn_dp == 1 else "attention TP %d (tp %d / attn-dp %d)" % (
        attn_tp, tp, attn_dp)
    if heads and heads % attn_tp:
        out.append(_problem(
            "tp", tp, "%s has %d attention heads, which %s does not divide: SGLang fails "
            "while loading the model (%s)" % (name, heads, width, HEADS_ASSERT[attention]),
            "use a TP whose attention width divides %d (%s)"
            % (heads, ", ".join(str(d) for d in _divisors(heads)))))
    elif attention == "MHA" and kv and ((kv >= attn_tp and kv % attn_tp) or
                                        (kv < attn_tp and attn_tp % kv)):
        out.append(_problem(
            "tp", tp, "%s has %d key/value heads: %s neither divides them nor is a multiple "
            "of them (%s)" % (name, kv, width, KV_HEADS_ASSERT),
            "use a TP that divides %d or is a multiple of it" % kv))
    experts = shape.get("n_routed_experts")
    if experts and ep > 1 and experts % ep:
        out.append(_problem(
            "ep", ep, "%s has %d routed experts, which EP %d does not divide: each EP rank "
            "holds num_experts // ep_size = %d of them, and %d would have no rank"
            % (name, experts, ep, experts // ep, experts % ep),
            "use an EP that divides %d (%s)"
            % (experts, ", ".join(str(d) for d in _divisors(experts)))))
    layers = shape.get("num_hidden_layers")
    if layers and pp > layers:
        out.append(_problem(
            "pp", pp, "%s has %d layers: PP %d would leave a pipeline stage without a layer "
            "(sglang/srt/distributed/utils.py get_pp_indices)" % (name, layers, pp),
            "use a PP of at most %d" % layers))
    return out


def fit_problem(name, weights_bytes, layout, gpu_memory_bytes, mem_fraction):
    """The weights each GPU holds against its memory, with the arithmetic: None when they
    fit or a figure is unknown. Weights split evenly over tp x pp GPUs (a lower bound: parts
    SGLang replicates only add to it), so a refusal here is certain."""
    if not weights_bytes or not gpu_memory_bytes:
        return None
    gpus = layout["tp"] * layout["pp"]
    per_gpu = weights_bytes / float(gpus)
    fraction = mem_fraction or DEFAULT_FRACTION_CEILING
    budget = gpu_memory_bytes * fraction
    if per_gpu <= budget:
        return None
    which = ("--mem-fraction-static %g" % fraction if mem_fraction else
             "%g, the most SGLang's default --mem-fraction-static reaches" % fraction)
    needed = int(-(-weights_bytes // budget))
    return _problem(
        "tp", layout["tp"],
        "%s's weights are %.0f GiB: over tp x pp = %d GPUs that is %.1f GiB per GPU, more than "
        "the %.1f GiB a %.1f GiB GPU gives them at %s, so loading fails (CUDA out of memory) "
        "or leaves no memory for the KV cache"
        % (name, weights_bytes / GIB, gpus, per_gpu / GIB, budget / GIB,
           gpu_memory_bytes / GIB, which),
        "spread the model over at least %d GPUs (tp x pp, across nodes with "
        "sglang_server_group), use GPUs with more memory, or a smaller (quantized) checkpoint"
        % needed)
