"""The models of the emulated-GPU testbed and their layer profiles (issue 37).

Five real models at the batch sizes GPU users train them with: torchvision
VGG16, ResNet-50, ResNet-18 and MobileNetV2 (224x224 images, 1,000 classes)
and a BERT-base-sized torch.nn Transformer encoder (`BertBase`). Used by
profile_flops.py (which counts each layer's FLOPs), tools/gpu/profile-layers
(which times each layer on a GPU), and emulated.py (which runs a model with
the times of a profile).

A layer is one call of a module that owns parameters itself or has no
children (a Conv2d, a BatchNorm2d, a ReLU; nn.MultiheadAttention, which owns
its input projection), in the order of the model's forward pass; a module
called twice (a ResNet block's ReLU) gives two layers. Each parameter belongs
to the first layer of the module that owns it, or, where that module is
never called (MultiheadAttention's out_proj, whose weight the attention
reads directly), of its nearest called ancestor.

A profile (JSON, PROFILE_FORMAT) holds, per layer: name (the module's path),
call (0 for its first call), type, forward_s and backward_s (seconds on the
accelerator, undilated), params (the names of the parameters whose gradients
its backward produces), and for an embedding, embedding_rows: "input" (the
rows of the batch's tokens) or the list of rows it reads. Beside them: the
model, batch, input and output shapes, params and grad_bytes (fp32
gradients, as DDP and baton send them), update_s (the optimizer's update of
every parameter), how the times were obtained (timing) and their sums.
"""

import json
import math

import torch
import torch.nn as nn

PROFILE_FORMAT = "baton-layer-profile/1"
IMAGE_CLASSES = 1000
BATCH = 32  # per accelerator, every model
BERT = dict(vocab=30522, width=768, layers=12, heads=12, ff=3072, max_positions=512, seq=128, classes=2)
MODELS = ["vgg16", "resnet50", "resnet18", "mobilenet_v2", "bert_base"]


class ProfileError(ValueError):
    """A profile file that cannot be used: the message says which and why."""


class BertBase(nn.Module):
    """BERT-base-sized sequence classifier from torch.nn parts: token and
    position embeddings (untied: only the rows of the batch's tokens get
    gradients), 12 post-norm encoder layers of width 768 with 12 heads and a
    3,072-wide GELU feed-forward, a tanh pooler on the first token and a
    2-class head. 109.5 M parameters."""

    def __init__(self, vocab, width, layers, heads, ff, max_positions, classes):
        super().__init__()
        self.token = nn.Embedding(vocab, width)
        self.position = nn.Embedding(max_positions, width)
        self.norm = nn.LayerNorm(width)
        layer = nn.TransformerEncoderLayer(width, heads, ff, activation="gelu", batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.pooler = nn.Linear(width, width)
        self.classifier = nn.Linear(width, classes)
        self.register_buffer("position_ids", torch.arange(max_positions), persistent=False)

    def forward(self, tokens):
        x = self.token(tokens) + self.position(self.position_ids[: tokens.shape[1]])
        x = self.encoder(self.norm(x))
        return self.classifier(torch.tanh(self.pooler(x[:, 0])))


def build(name):
    """The real model `name` (of MODELS) with freshly initialized weights,
    and a one-line description of it."""
    if name == "bert_base":
        b = BERT
        model = BertBase(b["vocab"], b["width"], b["layers"], b["heads"], b["ff"], b["max_positions"], b["classes"])
        return model, "bert_base(width=%d,layers=%d,heads=%d,ff=%d,vocab=%d,seq=%d)" % (
            b["width"], b["layers"], b["heads"], b["ff"], b["vocab"], b["seq"])
    if name not in MODELS:
        raise ValueError("unknown model %r: give one of %s" % (name, ", ".join(MODELS)))
    import torchvision

    model = getattr(torchvision.models, name)(weights=None, num_classes=IMAGE_CLASSES)
    return model, "torchvision.%s(num_classes=%d)" % (name, IMAGE_CLASSES)


def input_spec(name, batch=BATCH):
    """What the model reads: {"kind": "image"|"tokens", "shape": [...]} (and
    "vocab" for tokens)."""
    if name == "bert_base":
        return {"kind": "tokens", "shape": [batch, BERT["seq"]], "vocab": BERT["vocab"]}
    return {"kind": "image", "shape": [batch, 3, 224, 224]}


def example_input(spec, device="cpu", generator=None):
    """A batch as `spec` describes, on `device` (values only where not meta)."""
    if spec["kind"] == "tokens":
        if torch.device(device).type == "meta":
            return torch.empty(spec["shape"], dtype=torch.long, device=device)
        return torch.randint(0, spec["vocab"], spec["shape"], generator=generator).to(device)
    if torch.device(device).type == "meta":
        return torch.empty(spec["shape"], device=device)
    return torch.randn(spec["shape"], generator=generator).to(device)


def shapes(value):
    """Nested shapes of a module's inputs or outputs (tensors only)."""
    if isinstance(value, torch.Tensor):
        return list(value.shape)
    if isinstance(value, (tuple, list)):
        return [shapes(v) for v in value if isinstance(v, (torch.Tensor, tuple, list))]
    return None


def layer_modules(model):
    """{module: name} of the modules that are layers (see the module doc)."""
    return {m: n for n, m in model.named_modules() if not list(m.children()) or list(m._parameters)}


def trace(model, x, on_call=None):
    """Runs model(x) once (in training mode; on the meta device nothing is
    computed) and returns its layers in call order: dicts with name, call,
    type, module, inputs and outputs (the tensors, for counting), and
    params, the names of the parameters the layer's backward produces (see
    the module doc). on_call(record, inputs, output), when given, runs in
    each layer's forward hook. Raises ValueError where a layer calls another
    (its time would be counted twice) or a parameter has no layer."""
    layers, calls, stack, handles = [], {}, [], []
    names = layer_modules(model)

    def pre_hook(module, inputs):
        if stack:
            raise ValueError("layer %s calls layer %s: nested layers are not supported" % (stack[-1], names[module]))
        stack.append(names[module])

    def hook(module, inputs, output):
        stack.pop()
        name = names[module]
        record = {"name": name, "call": calls.get(name, 0), "type": type(module).__name__,
                  "module": module, "inputs": inputs, "output": output, "params": []}
        calls[name] = record["call"] + 1
        if on_call is not None:
            on_call(record, inputs, output)
        layers.append(record)

    for module in names:
        handles.append(module.register_forward_pre_hook(pre_hook))
        handles.append(module.register_forward_hook(hook))
    was_training = model.training
    model.train()
    try:
        with torch.enable_grad():
            model(x)
    finally:
        model.train(was_training)
        for h in handles:
            h.remove()
    first = {}
    for record in layers:
        first.setdefault(record["name"], record)
    for pname, _ in model.named_parameters():
        owner = pname.rsplit(".", 1)[0] if "." in pname else ""
        while owner not in first:
            if not owner:
                raise ValueError("parameter %s belongs to no module called in the forward pass" % pname)
            owner = owner.rsplit(".", 1)[0] if "." in owner else ""
        first[owner]["params"].append(pname)
    return layers


def embedding_rows(model, record, model_input, buffers):
    """Which rows of an embedding's weight a layer call reads: "input" when
    it reads the model's input tokens, else the sorted row list, found from
    the buffer it indexes (`buffers`: {name: CPU copy} of the model's
    buffers, whose values a meta trace no longer has)."""
    index = record["inputs"][0]
    if index is model_input:
        return "input"
    base = index._base if index._base is not None else index
    for name, buf in model.named_buffers():
        if buf is base and name in buffers:
            values = torch.as_strided(buffers[name], index.shape, index.stride(), index.storage_offset())
            return sorted(set(values.flatten().tolist()))
    raise ValueError("embedding %s reads indices that are neither the model's input nor a buffer" % record["name"])


def write_profile(path, profile):
    with open(path, "w") as f:
        json.dump(profile, f, indent=1)
        f.write("\n")


def _number(where, value, what):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise ProfileError("%s: %s must be a non-negative number, not %r" % (where, what, value))
    return float(value)


def load_profile(path, model=None, name=None):
    """Reads and checks a profile (of model `name`, when given). With `model`
    (the real model it is for),
    also checks that every parameter that requires grad belongs to exactly
    one layer, that the layers name only the model's parameters, and that
    embedding rows are in range. Raises ProfileError with the file and the
    first problem."""
    try:
        with open(path) as f:
            profile = json.load(f)
    except OSError as e:
        raise ProfileError("%s: cannot read: %s" % (path, e.strerror or e))
    except ValueError as e:
        raise ProfileError("%s: not JSON: %s" % (path, e))
    if not isinstance(profile, dict) or profile.get("format") != PROFILE_FORMAT:
        raise ProfileError("%s: not a layer profile (\"format\" is not %r)" % (path, PROFILE_FORMAT))
    for key in ("model", "batch", "input", "output_shape", "layers", "update_s", "timing"):
        if key not in profile:
            raise ProfileError("%s: no %r" % (path, key))
    if profile["model"] not in MODELS:
        raise ProfileError("%s: model %r is none of %s" % (path, profile["model"], ", ".join(MODELS)))
    if name is not None and profile["model"] != name:
        raise ProfileError("%s is a profile of %s, not of %s" % (path, profile["model"], name))
    batch = profile["batch"]
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise ProfileError("%s: batch must be a positive integer, not %r" % (path, batch))
    spec = profile["input"]
    if not isinstance(spec, dict) or spec.get("kind") not in ("image", "tokens") or not _is_shape(spec.get("shape")):
        raise ProfileError("%s: input must be {\"kind\": \"image\"|\"tokens\", \"shape\": [...]}" % path)
    if spec["shape"][0] != batch:
        raise ProfileError("%s: input shape %s does not start with the batch %d" % (path, spec["shape"], batch))
    if spec["kind"] == "tokens" and (not isinstance(spec.get("vocab"), int) or spec["vocab"] < 1):
        raise ProfileError("%s: token input needs a positive integer vocab" % path)
    if not _is_shape(profile["output_shape"]) or len(profile["output_shape"]) != 2:
        raise ProfileError("%s: output_shape must be [batch, classes]" % path)
    _number(path, profile["update_s"], "update_s")
    layers = profile["layers"]
    if not isinstance(layers, list) or not layers:
        raise ProfileError("%s: layers must be a non-empty list" % path)
    for i, layer in enumerate(layers):
        where = "%s: layer %d" % (path, i)
        if not isinstance(layer, dict) or not isinstance(layer.get("name"), str):
            raise ProfileError("%s: must be an object with a name" % where)
        where += " (%s)" % layer["name"]
        for key in ("forward_s", "backward_s"):
            layer[key] = _number(where, layer.get(key), key)
        params = layer.get("params", [])
        if not isinstance(params, list) or not all(isinstance(p, str) for p in params):
            raise ProfileError("%s: params must be a list of parameter names" % where)
        rows = layer.get("embedding_rows")
        if rows is not None and rows != "input" and not (
                isinstance(rows, list) and all(isinstance(r, int) and not isinstance(r, bool) and r >= 0 for r in rows)):
            raise ProfileError("%s: embedding_rows must be \"input\" or a list of row numbers" % where)
        if rows is not None and len(params) != 1:
            raise ProfileError("%s: an embedding layer has exactly one parameter, not %d" % (where, len(params)))
        if rows == "input" and spec["kind"] != "tokens":
            raise ProfileError("%s: embedding_rows \"input\" needs a token input" % where)
    # The sums are the layers', whatever the file says.
    profile["forward_s"] = sum(layer["forward_s"] for layer in layers)
    profile["backward_s"] = sum(layer["backward_s"] for layer in layers)
    profile["compute_s"] = profile["forward_s"] + profile["backward_s"] + profile["update_s"]
    if model is not None:
        _check_against(path, profile, model)
        profile["params"] = sum(p.numel() for p in model.parameters())
        profile["grad_bytes"] = sum(p.numel() * p.element_size() for p in model.parameters())
    elif not isinstance(profile.get("params"), int) or profile["params"] < 1:
        raise ProfileError("%s: params must be a positive integer" % path)
    return profile


def _is_shape(value):
    return isinstance(value, list) and value and all(
        isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in value)


def _check_against(path, profile, model):
    named = dict(model.named_parameters())
    seen = {}
    for i, layer in enumerate(profile["layers"]):
        for pname in layer.get("params", []):
            if pname not in named:
                raise ProfileError("%s: layer %d (%s) names parameter %s, which the model has not"
                                   % (path, i, layer["name"], pname))
            if pname in seen:
                raise ProfileError("%s: parameter %s belongs to layers %d and %d" % (path, pname, seen[pname], i))
            seen[pname] = i
        rows = layer.get("embedding_rows")
        if isinstance(rows, list) and rows:
            height = named[layer["params"][0]].shape[0]
            if max(rows) >= height:
                raise ProfileError("%s: layer %d (%s): embedding row %d is beyond the weight's %d rows"
                                   % (path, i, layer["name"], max(rows), height))
    missing = [n for n, p in named.items() if p.requires_grad and n not in seen]
    if missing:
        raise ProfileError("%s: no layer produces the gradients of %s%s" % (
            path, ", ".join(missing[:3]), " and %d more" % (len(missing) - 3) if len(missing) > 3 else ""))


def summary(model, layers, update_s):
    """The profile fields that sum up its layers and the model."""
    params = sum(p.numel() for p in model.parameters())
    forward = sum(layer["forward_s"] for layer in layers)
    backward = sum(layer["backward_s"] for layer in layers)
    return {
        "params": params,
        "grad_bytes": sum(p.numel() * p.element_size() for p in model.parameters()),
        "tensors": len(list(model.parameters())),
        "forward_s": forward,
        "backward_s": backward,
        "update_s": update_s,
        "compute_s": forward + backward + update_s,
    }
