"""Synthetic data for real training scripts run under the sanitizer (``bench/real_scripts/run.py``).

Python imports this module at start-up when its folder is on ``PYTHONPATH``,
before the sanitizer or the script run, so the script runs unchanged, as
``torchlint-sanitize script.py`` runs it, with its downloads replaced:

- ``torchvision.datasets`` (MNIST, FashionMNIST, CIFAR10, CIFAR100): random
  PIL images and labels, as many as the recipe asks for; where torchvision is
  not installed, a small stand-in of the parts these scripts use
  (``datasets``, ``transforms``, ``utils.save_image``) takes its place;
- ``tiktoken.get_encoding``: a byte-level stand-in (no BPE file to fetch);
- ``torch_geometric.datasets.Planetoid``: a random citation-like graph;
- a cap on optimizer steps (``max_steps``): the run ends with exit 0 when it
  is reached, a safety net for recipes whose length the script decides.

The recipe comes as JSON in ``TORCHLINT_REAL_SCRIPT_SPEC``. Nothing here
touches the sanitizer.
"""
import json
import os
import sys
import types

SPEC = json.loads(os.environ.get("TORCHLINT_REAL_SCRIPT_SPEC", "{}"))


def _images(name, options):
    """A torchvision-style dataset class: ``(PIL image, label)`` items, deterministic per index."""
    import numpy as np
    from PIL import Image

    size, channels, classes = options.get("size", 28), options.get("channels", 1), options.get("classes", 10)

    class SyntheticImages:
        def __init__(self, root=None, train=True, transform=None, target_transform=None, download=False, **_):
            self.train = train
            self.transform, self.target_transform = transform, target_transform
            self.length = options["train"] if train else options.get("test", options["train"] // 5)
            rng = np.random.default_rng(0 if train else 1)
            self.targets = rng.integers(0, classes, size=self.length).tolist()
            self.classes = [str(index) for index in range(classes)]

        def __len__(self):
            return self.length

        def __getitem__(self, index):
            rng = np.random.default_rng(index)
            shape = (size, size) if channels == 1 else (size, size, channels)
            image = Image.fromarray(rng.integers(0, 256, size=shape, dtype=np.uint8), "L" if channels == 1 else "RGB")
            target = self.targets[index]
            if self.transform is not None:
                image = self.transform(image)
            if self.target_transform is not None:
                target = self.target_transform(target)
            return image, target

    SyntheticImages.__name__ = SyntheticImages.__qualname__ = f"Synthetic{name}"
    return SyntheticImages


def _torchvision_stand_in():
    """The few parts of torchvision these scripts use, for a machine without it."""
    import numpy as np
    import torch

    package = types.ModuleType("torchvision")
    package.__path__ = []
    datasets = types.ModuleType("torchvision.datasets")
    transforms = types.ModuleType("torchvision.transforms")
    utils = types.ModuleType("torchvision.utils")

    class Compose:
        def __init__(self, steps):
            self.steps = steps

        def __call__(self, value):
            for step in self.steps:
                value = step(value)
            return value

    class ToTensor:
        def __call__(self, image):
            array = np.asarray(image, dtype=np.float32) / 255.0
            if array.ndim == 2:
                array = array[None]
            else:
                array = array.transpose(2, 0, 1)
            return torch.from_numpy(np.ascontiguousarray(array))

    class Resize:
        def __init__(self, size, **_):
            self.size = (size, size) if isinstance(size, int) else tuple(size)

        def __call__(self, image):
            return image.resize(self.size[::-1])

    class Normalize:
        def __init__(self, mean, std, **_):
            self.mean, self.std = torch.tensor(mean)[:, None, None], torch.tensor(std)[:, None, None]

        def __call__(self, tensor):
            return (tensor - self.mean) / self.std

    class Pad:
        def __init__(self, padding, **_):
            self.padding = padding

        def __call__(self, image):
            from PIL import ImageOps

            return ImageOps.expand(image, border=self.padding)

    class RandomHorizontalFlip:
        def __init__(self, p=0.5):
            self.p = p

        def __call__(self, image):
            from PIL import Image

            return image.transpose(Image.FLIP_LEFT_RIGHT) if np.random.random() < self.p else image

    class RandomCrop:
        def __init__(self, size, **_):
            self.size = size

        def __call__(self, image):
            left = np.random.randint(0, image.width - self.size + 1)
            top = np.random.randint(0, image.height - self.size + 1)
            return image.crop((left, top, left + self.size, top + self.size))

    for cls in (Compose, ToTensor, Resize, Normalize, Pad, RandomHorizontalFlip, RandomCrop):
        setattr(transforms, cls.__name__, cls)

    def save_image(tensor, path, **_):
        with open(path, "wb") as handle:
            handle.write(b"")  # the picture is not the point; the copy to the host that made it is

    utils.save_image = save_image
    package.datasets, package.transforms, package.utils = datasets, transforms, utils
    package.__version__ = "stand-in"
    sys.modules.update({"torchvision": package, "torchvision.datasets": datasets,
                        "torchvision.transforms": transforms, "torchvision.utils": utils})
    return package


def _install_images():
    wanted = SPEC.get("datasets") or {}
    if not wanted:
        return
    try:
        import torchvision
    except Exception:  # missing, or built for another torch
        for name in [key for key in sys.modules if key == "torchvision" or key.startswith("torchvision.")]:
            del sys.modules[name]
        torchvision = _torchvision_stand_in()
    for name, options in wanted.items():
        setattr(torchvision.datasets, name, _images(name, options))


class _Encoding:
    """Bytes as tokens: what train_gpt2.py asks of tiktoken's GPT-2 encoding, offline."""

    name, n_vocab, eot_token = "gpt2", 50257, 50256
    max_token_value = 50256

    def encode(self, text, **_):
        return list(text.encode("utf-8"))

    def encode_ordinary(self, text):
        return self.encode(text)

    def decode(self, tokens, **_):
        return bytes(token % 256 for token in tokens).decode("utf-8", "replace")

    def decode_bytes(self, tokens):
        return bytes(token % 256 for token in tokens)


def _install_tiktoken():
    if not SPEC.get("tiktoken"):
        return
    try:
        import tiktoken
    except ImportError:
        tiktoken = types.ModuleType("tiktoken")
        sys.modules["tiktoken"] = tiktoken
    tiktoken.get_encoding = lambda name: _Encoding()


def _install_planetoid():
    options = SPEC.get("planetoid")
    if not options:
        return
    import torch
    import torch_geometric.datasets
    from torch_geometric.data import Data

    class SyntheticPlanetoid:
        def __init__(self, root=None, name="Cora", transform=None, **_):
            generator = torch.Generator().manual_seed(0)
            nodes, edges = options["nodes"], options["edges"]
            self.num_classes, features = options["classes"], options["features"]
            x = torch.rand(nodes, features, generator=generator)
            edge_index = torch.randint(0, nodes, (2, edges), generator=generator)
            y = torch.randint(0, self.num_classes, (nodes,), generator=generator)
            order = torch.randperm(nodes, generator=generator)
            masks = [torch.zeros(nodes, dtype=torch.bool) for _ in range(3)]
            for mask, part in zip(masks, (order[:140], order[140:640], order[640:1640])):
                mask[part] = True
            data = Data(x=x, edge_index=edge_index, y=y, train_mask=masks[0], val_mask=masks[1], test_mask=masks[2])
            self.data = transform(data) if transform is not None else data
            self.num_features = features

        def __len__(self):
            return 1

        def __getitem__(self, index):
            return self.data

    torch_geometric.datasets.Planetoid = SyntheticPlanetoid


def _cap_steps():
    limit = SPEC.get("max_steps")
    if not limit:
        return
    import torch
    from torch.optim.optimizer import register_optimizer_step_post_hook

    counted = {"steps": 0, "lead": None}

    def stop_after(optimizer, args, kwargs):
        if counted["lead"] is None:
            counted["lead"] = id(optimizer)
        if id(optimizer) == counted["lead"]:
            counted["steps"] += 1
            if counted["steps"] >= limit:
                print(f"[real_scripts] {limit} optimizer steps reached: the run ends here", file=sys.stderr)
                raise SystemExit(0)

    register_optimizer_step_post_hook(stop_after)
    return torch


_install_images()
_install_tiktoken()
_install_planetoid()
_cap_steps()
