"""Metrics and data-dependent ops, written the way evaluation helpers often are (per-batch reads)."""
import pytest
import torch

pytestmark = pytest.mark.gpu


def topk_accuracy(logits, target, k=1):
    correct = logits.topk(k, dim=-1).indices.eq(target[:, None]).any(-1)
    return correct.float().mean().item()


class AverageMeter:
    def __init__(self):
        self.total, self.count = 0.0, 0

    def update(self, value, n=1):
        self.total += float(value) * n
        self.count += n

    @property
    def average(self):
        return self.total / max(self.count, 1)


def test_topk_accuracy_on_perfect_predictions(device):
    target = torch.randint(0, 10, (64,), device=device)
    logits = torch.nn.functional.one_hot(target, 10).float()
    assert topk_accuracy(logits, target) == 1.0


def test_evaluation_loop_with_an_average_meter(device):
    model = torch.nn.Linear(16, 10).to(device).eval()
    meter = AverageMeter()
    with torch.no_grad():
        for _ in range(10):
            x, target = torch.randn(32, 16, device=device), torch.randint(0, 10, (32,), device=device)
            meter.update(topk_accuracy(model(x), target, k=5), n=32)
    assert 0.0 <= meter.average <= 1.0


def test_confusion_matrix_with_bincount(device):
    pred = torch.randint(0, 4, (256,), device=device)
    target = torch.randint(0, 4, (256,), device=device)
    matrix = torch.bincount(target * 4 + pred, minlength=16).reshape(4, 4)
    assert matrix.sum().item() == 256
    torch.testing.assert_close(matrix.diag().sum(), (pred == target).sum())


def test_masked_mean_ignores_padding(device):
    values = torch.randn(8, 20, device=device)
    lengths = torch.randint(1, 21, (8,), device=device)
    mask = torch.arange(20, device=device)[None] < lengths[:, None]
    expected = torch.stack([values[i, : lengths[i]].mean() for i in range(8)])
    got = (values * mask).sum(1) / mask.sum(1)
    torch.testing.assert_close(got, expected)


def test_boolean_mask_selection(device):
    x = torch.randn(1000, device=device)
    positive = x[x > 0]
    assert (positive > 0).all()
    assert positive.numel() == (x > 0).sum().item()


def test_nonzero_and_unique(device):
    labels = torch.tensor([3, 1, 3, 0, 1, 3], device=device)
    assert labels.unique().tolist() == [0, 1, 3]
    assert (labels == 3).nonzero().flatten().tolist() == [0, 2, 5]


def test_iou_of_boxes(device):
    boxes = torch.tensor([[0.0, 0.0, 2.0, 2.0], [1.0, 1.0, 3.0, 3.0]], device=device)
    lt = torch.max(boxes[:, None, :2], boxes[None, :, :2])
    rb = torch.min(boxes[:, None, 2:], boxes[None, :, 2:])
    inter = (rb - lt).clamp(min=0).prod(-1)
    area = (boxes[:, 2:] - boxes[:, :2]).prod(-1)
    iou = inter / (area[:, None] + area[None] - inter)
    torch.testing.assert_close(iou.cpu(), torch.tensor([[1.0, 1 / 7], [1 / 7, 1.0]]))


def test_nms_keeps_the_best_box_per_cluster(device):
    boxes = torch.tensor([[0, 0, 10, 10], [1, 1, 10, 10], [20, 20, 30, 30]], dtype=torch.float, device=device)
    scores = torch.tensor([0.9, 0.8, 0.7], device=device)
    order = scores.argsort(descending=True)
    keep = []
    while order.numel() > 0:
        best = order[0]
        keep.append(best.item())
        lt = torch.max(boxes[best, :2], boxes[order[1:], :2])
        rb = torch.min(boxes[best, 2:], boxes[order[1:], 2:])
        inter = (rb - lt).clamp(min=0).prod(-1)
        area = (boxes[:, 2:] - boxes[:, :2]).prod(-1)
        iou = inter / (area[best] + area[order[1:]] - inter)
        order = order[1:][iou <= 0.5]
    assert keep == [0, 2]


@pytest.mark.parametrize("reduction", ["sum", "mean"])
def test_scatter_reduce_matches_a_loop(reduction, device):
    src = torch.randn(50, device=device)
    index = torch.randint(0, 5, (50,), device=device)
    got = torch.zeros(5, device=device).scatter_reduce(0, index, src, reduce=reduction, include_self=False)
    for bucket in range(5):
        members = src[index == bucket]
        if members.numel():
            expected = members.sum() if reduction == "sum" else members.mean()
            torch.testing.assert_close(got[bucket], expected)
