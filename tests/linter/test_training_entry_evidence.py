"""TL801 and TL803 state what they rest on: the convolution, the mixed precision
and where the training runs, whether the loop is the module's own or a
framework's (an mmengine Runner, a function handed to a launcher)."""
from __future__ import annotations

import textwrap

from ruletest import lint

from torchlint.registry import all_rules

FRAMEWORK = textwrap.dedent("""\
    import torchvision
    from mmengine.runner import Runner

    def main():
        runner = Runner(model=torchvision.models.resnet50(),
                        optim_wrapper=dict(type="AmpOptimWrapper", optimizer=dict(type="SGD", lr=0.1)))
        runner.train()

    if __name__ == "__main__":
        main()
""")

# TL803's own INVALID example: a training function handed to accelerate's notebook launcher.
LAUNCHED = next(example.source for example in all_rules()["TL803"].INVALID if "notebook_launcher" in example.source)


def _notes(diagnostic):
    return [(note.text, note.row) for note in diagnostic.evidence]


def test_a_framework_run_names_the_convolution_the_precision_and_the_run():
    (tl801,) = lint("TL801", FRAMEWORK)
    (tl803,) = lint("TL803", FRAMEWORK)
    assert tl801.row == tl803.row == 5  # the trainer, which takes the setting
    assert _notes(tl801) == [
        ("the network is convolutional: `torchvision.models.resnet50()`", 5),
        ("the mmengine trainer runs the training, on the GPU when one is present: `runner.train()`", 7),
    ]
    assert _notes(tl803)[1] == ('mixed precision: `type="AmpOptimWrapper"`', 6)


def test_a_launched_training_function_names_its_loop():
    (tl801,) = lint("TL801", LAUNCHED)
    (tl803,) = lint("TL803", LAUNCHED)
    assert _notes(tl801) == [
        ('the network is convolutional: `create_model("resnet50d")`', 6),
        ("it trains in `for batch in loader`", 7),
    ]
    assert _notes(tl803)[1] == ("mixed precision: `Accelerator(mixed_precision=mixed_precision)`", 5)


def test_without_a_launcher_or_a_main_block_a_training_function_is_no_script():
    library = LAUNCHED.replace("notebook_launcher(training_loop, ())\n", "")
    assert lint("TL801", library) == [] and lint("TL803", library) == []
