#!/usr/bin/python3
"""Writes the FLOPs-derived layer profiles of the emulated-GPU testbed
(issue 37): one JSON file per model (layer_models.py: VGG16, ResNet-50,
ResNet-18, MobileNetV2, BERT-base), PROFILES/<model>.flops.json.

  tools/bench/scheduling/profile_flops.py                  # every model, into profiles/
  tools/bench/scheduling/profile_flops.py --model resnet50 --out /tmp/p

The times are a model, not a measurement: each layer call is traced on
PyTorch's meta device at the benchmark batch (32), its FLOPs and its memory
traffic are counted from its input and output shapes, and it takes
max(FLOPs / --flops, bytes / --bandwidth) forward (a roofline) and
--backward-ratio times that backward. The defaults stand for an A100-class
GPU training in fp16 (312 TFLOP/s dense tensor-core peak, 1.56 TB/s HBM2):
an effective 100 TFLOP/s and 1.5 TB/s, activations and weights read and
written at 2 bytes an element. The optimizer update (SGD with momentum on
fp32 master weights: parameter, gradient and momentum read, parameter and
momentum written, 20 bytes a parameter) takes its bytes / --bandwidth.
Kernel launches, the gradients' fp16-to-fp32 casts and the functional ops
between layers (residual additions, GELU inside the Transformer's
feed-forward) are not counted.

Counting (a multiply-add is 2 FLOPs):
  Conv2d              2 x output elements x in-channels/groups x kernel area
  Linear              2 x output elements x in-features
  MultiheadAttention  input projection, Q.K^T, softmax (5 per score), the
                      weighted sum and the output projection
  BatchNorm2d, LayerNorm  5 per element (training: mean, variance, scale)
  ReLU, ReLU6, GELU, Tanh, Dropout  1 per element
  pooling             1 per input element
  Embedding           no FLOPs (a gather: its bytes only)
  Flatten, Identity   nothing
An unknown layer type is an error, so a new model is counted explicitly.
"""

import argparse
import math
import os
import sys

import torch
import torch.nn as nn

import layer_models

HERE = os.path.dirname(os.path.abspath(__file__))
ELEMENTWISE = (nn.ReLU, nn.ReLU6, nn.GELU, nn.Tanh, nn.Dropout, nn.Sigmoid, nn.SiLU, nn.Hardswish)
POOLING = (nn.MaxPool2d, nn.AvgPool2d, nn.AdaptiveAvgPool2d)
FREE = (nn.Flatten, nn.Identity)


def count(record):
    """(FLOPs, elements moved) of one layer call: inputs, outputs and the
    layer's own weights (MultiheadAttention: its score matrix too)."""
    module, inputs, output = record["module"], record["inputs"], record["output"]
    x = inputs[0]
    out = output[0] if isinstance(output, tuple) else output
    weights = sum(p.numel() for p in module.parameters())
    moved = x.numel() + out.numel() + weights
    bias = out.numel() if getattr(module, "bias", None) is not None else 0
    if isinstance(module, nn.Conv2d):
        kh, kw = module.kernel_size
        return 2 * out.numel() * (module.in_channels // module.groups) * kh * kw + bias, moved
    if isinstance(module, nn.Linear):
        return 2 * out.numel() * module.in_features + bias, moved
    if isinstance(module, nn.MultiheadAttention):
        if not module.batch_first:
            raise ValueError("%s: only batch_first attention is counted" % record["name"])
        batch, length, width = x.shape
        scores = batch * module.num_heads * length * length
        tokens = batch * length
        flops = (2 * tokens * width * 3 * width  # Q, K, V projections
                 + 2 * batch * length * length * width  # Q.K^T, every head
                 + 5 * scores  # softmax
                 + 2 * batch * length * length * width  # weights x V
                 + 2 * tokens * width * width)  # output projection
        return flops, moved + 2 * scores + 3 * tokens * width
    if isinstance(module, (nn.BatchNorm2d, nn.LayerNorm)):
        return 5 * out.numel(), moved
    if isinstance(module, ELEMENTWISE):
        return out.numel(), moved
    if isinstance(module, POOLING):
        return x.numel(), moved
    if isinstance(module, nn.Embedding):
        return 0, 2 * out.numel()
    if isinstance(module, FREE):
        return 0, 0
    raise ValueError("%s: no FLOPs rule for %s" % (record["name"], type(module).__name__))


def profile(name, flops_per_s, bytes_per_s, element_bytes, backward_ratio):
    torch.manual_seed(0)
    model, description = layer_models.build(name)
    buffers = {n: b.detach().clone() for n, b in model.named_buffers()}
    model.to("meta")
    spec = layer_models.input_spec(name)
    x = layer_models.example_input(spec, device="meta")
    layers = []

    def on_call(record, inputs, output):
        flops, moved = count(record)
        forward = max(flops / flops_per_s, moved * element_bytes / bytes_per_s)
        layer = {
            "name": record["name"],
            "call": record["call"],
            "type": record["type"],
            "forward_s": forward,
            "backward_s": backward_ratio * forward,
            "flops": flops,
            "bytes": moved * element_bytes,
            "output_shape": layer_models.shapes(output),
        }
        if isinstance(record["module"], nn.Embedding):
            layer["embedding_rows"] = layer_models.embedding_rows(model, record, x, buffers)
        layers.append(layer)

    traced = layer_models.trace(model, x, on_call)
    for layer, record in zip(layers, traced):
        layer["params"] = record["params"]
    params = sum(p.numel() for p in model.parameters())
    update = 20 * params / bytes_per_s
    result = {
        "format": layer_models.PROFILE_FORMAT,
        "model": name,
        "description": description,
        "batch": spec["shape"][0],
        "input": spec,
        "output_shape": list(model(x).shape),
        "source": "flops",
        "timing": {
            "method": "roofline: forward = max(FLOPs / flops_per_s, bytes / bytes_per_s), "
                      "backward = backward_ratio x forward; update = 20 bytes a parameter / bytes_per_s",
            "flops_per_s": flops_per_s,
            "bytes_per_s": bytes_per_s,
            "element_bytes": element_bytes,
            "backward_ratio": backward_ratio,
            "stands_for": "an A100-class GPU in fp16 (effective, not peak)",
            "generator": "tools/bench/scheduling/profile_flops.py",
        },
    }
    result.update(layer_models.summary(model, layers, update))
    result["flops"] = sum(layer["flops"] for layer in layers)
    result["layers"] = layers
    return result


def positive(text):
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError("%r is not a number" % text)
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError("%r: give a positive number" % text)
    return value


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", action="append", choices=layer_models.MODELS,
                        help="a model to profile (repeatable; default: every one)")
    parser.add_argument("--out", default=os.path.join(HERE, "profiles"), help="directory to write into")
    parser.add_argument("--flops", type=positive, default=100e12, help="FLOP/s (default 100e12)")
    parser.add_argument("--bandwidth", type=positive, default=1.5e12, help="memory bytes/s (default 1.5e12)")
    parser.add_argument("--element-bytes", type=positive, default=2, help="bytes an element (default 2: fp16)")
    parser.add_argument("--backward-ratio", type=positive, default=2.0, help="backward / forward (default 2)")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    for name in args.model or layer_models.MODELS:
        p = profile(name, args.flops, args.bandwidth, args.element_bytes, args.backward_ratio)
        path = os.path.join(args.out, "%s.flops.json" % name)
        layer_models.write_profile(path, p)
        print("%s: %d layers, %.1f M parameters (%.1f MiB of gradients), %.1f GFLOP forward; "
              "forward %.2f ms + backward %.2f ms + update %.2f ms = %.2f ms -> %s"
              % (name, len(p["layers"]), p["params"] / 1e6, p["grad_bytes"] / 2**20, p["flops"] / 1e9,
                 1e3 * p["forward_s"], 1e3 * p["backward_s"], 1e3 * p["update_s"], 1e3 * p["compute_s"], path),
              file=sys.stderr)


if __name__ == "__main__":
    main()
