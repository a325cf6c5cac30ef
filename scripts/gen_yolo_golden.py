#!/usr/bin/env python3
"""Generates the YOLOv8 parity goldens with a PyTorch reference (Debian's python3-torch 1.13; no Ultralytics).

usage: /usr/bin/python3 scripts/gen_yolo_golden.py OUT_DIR        (OUT_DIR: tests/data/models)
Writes
  yolo_parity.safetensors   the reference's numbers (below), ~1 MB
  yolo_parity.json          what was generated, how, with which versions; the state-dict keys; the counts
The C++ test (src/ampforge/models/yolo_parity_test.cpp) never runs Python.

The reference is written here in torch from Ultralytics 8.x's formulas (facts in ../shared/docs/specs/MODELS.md
§A; modules conv.py/block.py/head.py, the yolov8.yaml graph, utils/loss.py v8DetectionLoss + BboxLoss + DFLoss,
utils/tal.py TaskAlignedAssigner + make_anchors + dist2bbox + bbox2dist, utils/metrics.py bbox_iou with CIoU).
It is an independent re-statement of those formulas, not Ultralytics' code; module names and registration order
follow Ultralytics so the state-dict keys are Ultralytics' ("model.0.conv.weight", "model.22.dfl.conv.weight").

Weights and inputs are not stored: both sides compute them from the integer hash of scripts/gen_resnet_golden.py
(splitmix64; same per-tensor rules: s = 1 + index in state_dict order), except the frozen DFL conv, which keeps
its arange(16) weights on both sides, and the last convs' biases of the head, which get Ultralytics' bias_init
(box 1.0, class log(5 / 80 / (640 / stride)^2)) on both sides so the class loss has its realistic size. The input x (2, 3, 128, 128) is the hash stream 2^20 (c 0, a 1).

Recorded (F32 unless said):
  yolov8n.raw_train        (2, 144, 336) training-mode output (levels flattened and concatenated), train-mode BN
  yolov8n.decoded_eval     (2, 84, 336)  eval-mode output: boxes cxcywh pixels + class probabilities
  yolov8n.loss             (4,) F64 [box, cls, dfl] after gains, and the total (sum * batch size)
  yolov8n.grad_sum / grad_abs_sum / grad_l2 / grad_absmax   (P,) F64 per parameter (named_parameters order,
                           the frozen DFL weight excluded: it has no gradient)
  yolov8n.grad_index / grad_sample   (P, 32) positions (splitmix64(s * 2^40 + 2^39 + k) mod numel) and values
  yolov8n.running_mean / running_var  every BN's statistics after the training forward, concatenated
  yolov8n.f64.*            the same computed in float64 (the problem's own sensitivity to rounding)
  targets                  (2, 4, 5) the loss's targets (class, cx, cy, w, h normalised); image 1's rows 2, 3 pad
  assign.*                 a hand-made assigner case (inputs and Ultralytics' outputs)
  ciou.box1 / box2 / value / grad1   CIoU of 64 box pairs and d(sum CIoU)/d box1
  counts                   (5,) I64 parameters of yolov8n/s/m/l/x at 80 classes
"""
import datetime
import json
import math
import sys
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gen_golden import write_safetensors  # noqa: E402
from gen_resnet_golden import hashed, sample_index, set_hashed_weights  # noqa: E402

INPUT_STREAM = 1 << 20
BATCH, SIZE = 2, 128
REG_MAX = 16
SCALES = {"n": (0.33, 0.25, 1024), "s": (0.33, 0.50, 1024), "m": (0.67, 0.75, 768), "l": (1.00, 1.00, 512),
          "x": (1.00, 1.25, 512)}


# ---- model (MODELS.md §A.1-A.3) ---------------------------------------------------------------------------
class Conv(nn.Module):
    def __init__(self, c1, c2, k=1, s=1):
        super().__init__()
        self.conv = nn.Conv2d(c1, c2, k, s, k // 2, bias=False)
        self.bn = nn.BatchNorm2d(c2, eps=1e-3, momentum=0.03)

    def forward(self, x):
        return F.silu(self.bn(self.conv(x)))


class Bottleneck(nn.Module):
    def __init__(self, c1, c2, shortcut=True, e=0.5):
        super().__init__()
        c_ = int(c2 * e)
        self.cv1 = Conv(c1, c_, 3)
        self.cv2 = Conv(c_, c2, 3)
        self.add = shortcut and c1 == c2

    def forward(self, x):
        y = self.cv2(self.cv1(x))
        return x + y if self.add else y


class C2f(nn.Module):
    def __init__(self, c1, c2, n=1, shortcut=False, e=0.5):
        super().__init__()
        self.c = int(c2 * e)
        self.cv1 = Conv(c1, 2 * self.c, 1)
        self.cv2 = Conv((2 + n) * self.c, c2, 1)
        self.m = nn.ModuleList(Bottleneck(self.c, self.c, shortcut, e=1.0) for _ in range(n))

    def forward(self, x):
        y = list(self.cv1(x).chunk(2, 1))
        for m in self.m:
            y.append(m(y[-1]))
        return self.cv2(torch.cat(y, 1))


class SPPF(nn.Module):
    def __init__(self, c1, c2, k=5):
        super().__init__()
        c_ = c1 // 2
        self.cv1 = Conv(c1, c_, 1)
        self.cv2 = Conv(c_ * 4, c2, 1)
        self.m = nn.MaxPool2d(k, 1, k // 2)

    def forward(self, x):
        y = [self.cv1(x)]
        for _ in range(3):
            y.append(self.m(y[-1]))
        return self.cv2(torch.cat(y, 1))


class DFL(nn.Module):
    def __init__(self, c1=16):
        super().__init__()
        self.conv = nn.Conv2d(c1, 1, 1, bias=False).requires_grad_(False)
        with torch.no_grad():
            self.conv.weight.copy_(torch.arange(c1, dtype=torch.float).view(1, c1, 1, 1))
        self.c1 = c1

    def forward(self, x):
        b, _, a = x.shape
        return self.conv(x.view(b, 4, self.c1, a).transpose(2, 1).softmax(1)).view(b, 4, a)


class Detect(nn.Module):
    def __init__(self, nc, ch):
        super().__init__()
        self.nc, self.nl, self.no = nc, len(ch), nc + 4 * REG_MAX
        self.stride = torch.zeros(self.nl)
        c2, c3 = max(16, ch[0] // 4, 4 * REG_MAX), max(ch[0], min(nc, 100))
        self.cv2 = nn.ModuleList(nn.Sequential(Conv(x, c2, 3), Conv(c2, c2, 3), nn.Conv2d(c2, 4 * REG_MAX, 1)) for x in ch)
        self.cv3 = nn.ModuleList(nn.Sequential(Conv(x, c3, 3), Conv(c3, c3, 3), nn.Conv2d(c3, nc, 1)) for x in ch)
        self.dfl = DFL(REG_MAX)

    def forward(self, xs):
        x = [torch.cat((self.cv2[i](xs[i]), self.cv3[i](xs[i])), 1) for i in range(self.nl)]
        if self.training:
            return x
        shape = x[0].shape
        x_cat = torch.cat([xi.view(shape[0], self.no, -1) for xi in x], 2)
        anchors, strides = (t.transpose(0, 1) for t in make_anchors(x, self.stride, 0.5))
        box, cls = x_cat.split((REG_MAX * 4, self.nc), 1)
        dbox = dist2bbox(self.dfl(box), anchors.unsqueeze(0), xywh=True, dim=1) * strides
        return torch.cat((dbox, cls.sigmoid()), 1)

    def bias_init(self):
        for a, b, s in zip(self.cv2, self.cv3, self.stride):
            a[-1].bias.data[:] = 1.0
            b[-1].bias.data[: self.nc] = math.log(5 / self.nc / (640 / s) ** 2)


class Upsample(nn.Upsample):
    def __init__(self):
        super().__init__(None, 2, "nearest")


class Concat(nn.Module):
    pass


def make_divisible(x, d=8):
    return math.ceil(x / d) * d


class DetectionModel(nn.Module):
    def __init__(self, scale="n", nc=80, ch=3):
        super().__init__()
        depth, width, maxc = SCALES[scale]
        c = lambda v: make_divisible(min(v, maxc) * width, 8)  # noqa: E731
        r = lambda n: max(round(n * depth), 1) if n > 1 else n  # noqa: E731
        L = [Conv(ch, c(64), 3, 2), Conv(c(64), c(128), 3, 2), C2f(c(128), c(128), r(3), True),
             Conv(c(128), c(256), 3, 2), C2f(c(256), c(256), r(6), True), Conv(c(256), c(512), 3, 2),
             C2f(c(512), c(512), r(6), True), Conv(c(512), c(1024), 3, 2), C2f(c(1024), c(1024), r(3), True),
             SPPF(c(1024), c(1024), 5), Upsample(), Concat(), C2f(c(1024) + c(512), c(512), r(3)), Upsample(),
             Concat(), C2f(c(512) + c(256), c(256), r(3)), Conv(c(256), c(256), 3, 2), Concat(),
             C2f(c(256) + c(512), c(512), r(3)), Conv(c(512), c(512), 3, 2), Concat(),
             C2f(c(512) + c(1024), c(1024), r(3)), Detect(nc, [c(256), c(512), c(1024)])]
        self.model = nn.Sequential(*L)
        det = self.model[22]
        s = 256  # DetectionModel.__init__: a 256x256 zeros forward measures the strides
        self.train()
        det.stride = torch.tensor([s / x.shape[-2] for x in self.forward(torch.zeros(1, ch, s, s))])
        det.bias_init()

    def forward(self, x):
        m = self.model
        y = [None] * 23
        h = x
        for i in range(10):
            h = y[i] = m[i](h)
        y[10] = m[10](y[9])
        y[12] = m[12](torch.cat((y[10], y[6]), 1))
        y[13] = m[13](y[12])
        y[15] = m[15](torch.cat((y[13], y[4]), 1))
        y[16] = m[16](y[15])
        y[18] = m[18](torch.cat((y[16], y[12]), 1))
        y[19] = m[19](y[18])
        y[21] = m[21](torch.cat((y[19], y[9]), 1))
        return m[22]([y[15], y[18], y[21]])


# ---- tal.py / metrics.py formulas ----------------------------------------------------------------------------
def make_anchors(feats, strides, offset=0.5):
    pts, sts = [], []
    dtype, device = feats[0].dtype, feats[0].device
    for i, s in enumerate(strides):
        _, _, h, w = feats[i].shape
        sx = torch.arange(w, device=device, dtype=dtype) + offset
        sy = torch.arange(h, device=device, dtype=dtype) + offset
        sy, sx = torch.meshgrid(sy, sx, indexing="ij")
        pts.append(torch.stack((sx, sy), -1).view(-1, 2))
        sts.append(torch.full((h * w, 1), float(s), dtype=dtype, device=device))
    return torch.cat(pts), torch.cat(sts)


def dist2bbox(distance, anchor_points, xywh=True, dim=-1):
    lt, rb = distance.chunk(2, dim)
    x1y1, x2y2 = anchor_points - lt, anchor_points + rb
    if xywh:
        return torch.cat(((x1y1 + x2y2) / 2, x2y2 - x1y1), dim)
    return torch.cat((x1y1, x2y2), dim)


def bbox2dist(anchor_points, bbox, reg_max):
    x1y1, x2y2 = bbox.chunk(2, -1)
    return torch.cat((anchor_points - x1y1, x2y2 - anchor_points), -1).clamp_(0, reg_max - 0.01)


def bbox_ciou(box1, box2, eps=1e-7):
    b1_x1, b1_y1, b1_x2, b1_y2 = box1.chunk(4, -1)
    b2_x1, b2_y1, b2_x2, b2_y2 = box2.chunk(4, -1)
    w1, h1 = b1_x2 - b1_x1, (b1_y2 - b1_y1).clamp(eps)
    w2, h2 = b2_x2 - b2_x1, (b2_y2 - b2_y1).clamp(eps)
    inter = (b1_x2.minimum(b2_x2) - b1_x1.maximum(b2_x1)).clamp(0) * \
            (b1_y2.minimum(b2_y2) - b1_y1.maximum(b2_y1)).clamp(0)
    union = w1 * h1 + w2 * h2 - inter + eps
    iou = inter / union
    cw = b1_x2.maximum(b2_x2) - b1_x1.minimum(b2_x1)
    ch = b1_y2.maximum(b2_y2) - b1_y1.minimum(b2_y1)
    c2 = cw.pow(2) + ch.pow(2) + eps
    rho2 = ((b2_x1 + b2_x2 - b1_x1 - b1_x2).pow(2) + (b2_y1 + b2_y2 - b1_y1 - b1_y2).pow(2)) / 4
    v = (4 / math.pi ** 2) * ((w2 / h2).atan() - (w1 / h1).atan()).pow(2)
    with torch.no_grad():
        alpha = v / (v - iou + (1 + eps))
    return iou - (rho2 / c2 + v * alpha)


class TaskAlignedAssigner:
    def __init__(self, topk=10, num_classes=80, alpha=0.5, beta=6.0, eps=1e-9):
        self.topk, self.num_classes, self.bg_idx = topk, num_classes, num_classes
        self.alpha, self.beta, self.eps = alpha, beta, eps

    @torch.no_grad()
    def __call__(self, pd_scores, pd_bboxes, anc_points, gt_labels, gt_bboxes, mask_gt):
        self.bs, self.n_max_boxes = pd_scores.shape[0], gt_bboxes.shape[1]
        if self.n_max_boxes == 0:
            return (torch.full_like(pd_scores[..., 0], self.bg_idx), torch.zeros_like(pd_bboxes),
                    torch.zeros_like(pd_scores), torch.zeros_like(pd_scores[..., 0]),
                    torch.zeros_like(pd_scores[..., 0]))
        mask_pos, align_metric, overlaps = self.get_pos_mask(pd_scores, pd_bboxes, gt_labels, gt_bboxes, anc_points,
                                                             mask_gt)
        target_gt_idx, fg_mask, mask_pos = self.select_highest_overlaps(mask_pos, overlaps)
        target_labels, target_bboxes, target_scores = self.get_targets(gt_labels, gt_bboxes, target_gt_idx, fg_mask)
        align_metric *= mask_pos
        pos_align_metrics = align_metric.amax(dim=-1, keepdim=True)
        pos_overlaps = (overlaps * mask_pos).amax(dim=-1, keepdim=True)
        norm_align_metric = (align_metric * pos_overlaps / (pos_align_metrics + self.eps)).amax(-2).unsqueeze(-1)
        target_scores = target_scores * norm_align_metric
        return target_labels, target_bboxes, target_scores, fg_mask.bool(), target_gt_idx

    def get_pos_mask(self, pd_scores, pd_bboxes, gt_labels, gt_bboxes, anc_points, mask_gt):
        mask_in_gts = self.select_candidates_in_gts(anc_points, gt_bboxes)
        align_metric, overlaps = self.get_box_metrics(pd_scores, pd_bboxes, gt_labels, gt_bboxes, mask_in_gts * mask_gt)
        mask_topk = self.select_topk_candidates(align_metric, topk_mask=mask_gt.expand(-1, -1, self.topk).bool())
        return mask_topk * mask_in_gts * mask_gt, align_metric, overlaps

    def get_box_metrics(self, pd_scores, pd_bboxes, gt_labels, gt_bboxes, mask_gt):
        na = pd_bboxes.shape[-2]
        mask_gt = mask_gt.bool()
        dev = pd_bboxes.device
        overlaps = torch.zeros([self.bs, self.n_max_boxes, na], dtype=pd_bboxes.dtype, device=dev)
        bbox_scores = torch.zeros([self.bs, self.n_max_boxes, na], dtype=pd_scores.dtype, device=dev)
        ind = torch.zeros([2, self.bs, self.n_max_boxes], dtype=torch.long, device=dev)
        ind[0] = torch.arange(end=self.bs, device=dev).view(-1, 1).expand(-1, self.n_max_boxes)
        ind[1] = gt_labels.squeeze(-1)
        bbox_scores[mask_gt] = pd_scores[ind[0], :, ind[1]][mask_gt]
        pd_boxes = pd_bboxes.unsqueeze(1).expand(-1, self.n_max_boxes, -1, -1)[mask_gt]
        gt_boxes = gt_bboxes.unsqueeze(2).expand(-1, -1, na, -1)[mask_gt]
        overlaps[mask_gt] = bbox_ciou(gt_boxes, pd_boxes).squeeze(-1).clamp_(0)
        align_metric = bbox_scores.pow(self.alpha) * overlaps.pow(self.beta)
        return align_metric, overlaps

    def select_topk_candidates(self, metrics, topk_mask):
        topk_metrics, topk_idxs = torch.topk(metrics, self.topk, dim=-1, largest=True)
        topk_idxs.masked_fill_(~topk_mask, 0)
        count = torch.zeros(metrics.shape, dtype=torch.int8, device=metrics.device)
        ones = torch.ones_like(topk_idxs[:, :, :1], dtype=torch.int8)
        for k in range(self.topk):
            count.scatter_add_(-1, topk_idxs[:, :, k:k + 1], ones)
        count.masked_fill_(count > 1, 0)
        return count.to(metrics.dtype)

    def get_targets(self, gt_labels, gt_bboxes, target_gt_idx, fg_mask):
        batch_ind = torch.arange(end=self.bs, dtype=torch.int64, device=gt_labels.device)[..., None]
        target_gt_idx = target_gt_idx + batch_ind * self.n_max_boxes
        target_labels = gt_labels.long().flatten()[target_gt_idx]
        target_bboxes = gt_bboxes.view(-1, gt_bboxes.shape[-1])[target_gt_idx]
        target_labels.clamp_(0)
        target_scores = torch.zeros((target_labels.shape[0], target_labels.shape[1], self.num_classes),
                                    dtype=torch.int64, device=target_labels.device)
        target_scores.scatter_(2, target_labels.unsqueeze(-1), 1)
        fg_scores_mask = fg_mask[:, :, None].repeat(1, 1, self.num_classes)
        target_scores = torch.where(fg_scores_mask > 0, target_scores, 0)
        return target_labels, target_bboxes, target_scores

    @staticmethod
    def select_candidates_in_gts(xy_centers, gt_bboxes, eps=1e-9):
        n_anchors = xy_centers.shape[0]
        bs, n_boxes, _ = gt_bboxes.shape
        lt, rb = gt_bboxes.view(-1, 1, 4).chunk(2, 2)
        deltas = torch.cat((xy_centers[None] - lt, rb - xy_centers[None]), dim=2).view(bs, n_boxes, n_anchors, -1)
        return deltas.amin(3).gt_(eps)

    def select_highest_overlaps(self, mask_pos, overlaps):
        fg_mask = mask_pos.sum(-2)
        if fg_mask.max() > 1:
            mask_multi_gts = (fg_mask.unsqueeze(1) > 1).expand(-1, self.n_max_boxes, -1)
            max_overlaps_idx = overlaps.argmax(1)
            is_max_overlaps = torch.zeros(mask_pos.shape, dtype=mask_pos.dtype, device=mask_pos.device)
            is_max_overlaps.scatter_(1, max_overlaps_idx.unsqueeze(1), 1)
            mask_pos = torch.where(mask_multi_gts, is_max_overlaps, mask_pos).float()
            fg_mask = mask_pos.sum(-2)
        target_gt_idx = mask_pos.argmax(-2)
        return target_gt_idx, fg_mask, mask_pos


def detection_loss(feats, strides, targets, nc, dtype):
    """v8DetectionLoss.__call__ for a padded (B, M, 5) target tensor (class, cx, cy, w, h normalised)."""
    no = nc + 4 * REG_MAX
    b = feats[0].shape[0]
    pred_distri, pred_scores = torch.cat([xi.view(b, no, -1) for xi in feats], 2).split((REG_MAX * 4, nc), 1)
    pred_scores = pred_scores.permute(0, 2, 1).contiguous()
    pred_distri = pred_distri.permute(0, 2, 1).contiguous()
    dev = feats[0].device  # every tensor made here on the features' device (the bench's peer runs this on CUDA)
    imgsz = torch.tensor(feats[0].shape[2:], dtype=dtype, device=dev) * strides[0]
    anchor_points, stride_tensor = make_anchors(feats, strides, 0.5)
    t = targets.to(dev, dtype).clone()
    gt_labels = t[..., :1]
    xywh = t[..., 1:5] * imgsz[[1, 0, 1, 0]]
    gt_bboxes = torch.cat((xywh[..., :2] - xywh[..., 2:] / 2, xywh[..., :2] + xywh[..., 2:] / 2), -1)
    mask_gt = ((t[..., 3] > 0) & (t[..., 4] > 0)).unsqueeze(-1).to(dtype)  # padding rows are zeros
    proj = torch.arange(REG_MAX, dtype=dtype, device=dev)
    bb, a, c = pred_distri.shape
    pred_bboxes = dist2bbox(pred_distri.view(bb, a, 4, c // 4).softmax(3).matmul(proj), anchor_points, xywh=False)
    assigner = TaskAlignedAssigner(topk=10, num_classes=nc, alpha=0.5, beta=6.0)
    _, target_bboxes, target_scores, fg_mask, _ = assigner(
        pred_scores.detach().sigmoid(), (pred_bboxes.detach() * stride_tensor).type(gt_bboxes.dtype),
        anchor_points * stride_tensor, gt_labels, gt_bboxes, mask_gt)
    target_scores_sum = max(target_scores.sum(), 1)
    loss = torch.zeros(3, dtype=dtype, device=dev)
    loss[1] = F.binary_cross_entropy_with_logits(pred_scores, target_scores.to(dtype), reduction="none").sum() / target_scores_sum
    if fg_mask.sum():
        target_bboxes = target_bboxes / stride_tensor
        weight = target_scores.sum(-1)[fg_mask].unsqueeze(-1)
        iou = bbox_ciou(pred_bboxes[fg_mask], target_bboxes[fg_mask])
        loss[0] = ((1.0 - iou) * weight).sum() / target_scores_sum
        target_ltrb = bbox2dist(anchor_points, target_bboxes, REG_MAX - 1)
        pd = pred_distri[fg_mask].view(-1, REG_MAX)
        tgt = target_ltrb[fg_mask].clamp_(0, REG_MAX - 1 - 0.01)
        tl = tgt.long()
        tr = tl + 1
        wl = tr - tgt
        wr = 1 - wl
        dfl = (F.cross_entropy(pd, tl.view(-1), reduction="none").view(tl.shape) * wl +
               F.cross_entropy(pd, tr.view(-1), reduction="none").view(tl.shape) * wr).mean(-1, keepdim=True)
        loss[2] = (dfl * weight).sum() / target_scores_sum
    loss[0] *= 7.5
    loss[1] *= 0.5
    loss[2] *= 1.5
    return loss.sum() * b, loss.detach()


# ---- the recorded cases ------------------------------------------------------------------------------------------
def make_targets():
    # image 0: four objects; image 1: two objects and two padding rows (zeros). The small box centred on the
    # stride-32 anchor (48, 48) has fewer than topk candidates, so anchors of all three levels are assigned.
    return torch.tensor([[[0, 0.30, 0.35, 0.30, 0.40], [5, 0.70, 0.60, 0.35, 0.30], [2, 0.55, 0.45, 0.50, 0.55],
                          [3, 0.375, 0.375, 0.15625, 0.15625]],
                         [[7, 0.40, 0.50, 0.45, 0.35], [1, 0.72, 0.30, 0.25, 0.28], [0, 0.0, 0.0, 0.0, 0.0],
                          [0, 0.0, 0.0, 0.0, 0.0]]], dtype=torch.float32)


def run_model(dtype):
    torch.manual_seed(0)
    model = DetectionModel("n", 80, 3)
    weight_sum = set_hashed_weights(model)
    with torch.no_grad():  # the frozen DFL keeps its bins on both sides
        model.model[22].dfl.conv.weight.copy_(torch.arange(16, dtype=torch.float).view(1, 16, 1, 1))
    model.model[22].bias_init()  # and the head's biases are Ultralytics' (box 1.0, class log(5/nc/(640/s)^2))
    model = model.to(dtype)
    x = torch.from_numpy(hashed(INPUT_STREAM, [BATCH, 3, SIZE, SIZE], 0.0, 1.0)).to(dtype)
    sd_names = list(model.state_dict().keys())
    model.eval()
    with torch.no_grad():
        decoded = model(x)
    model.train()
    feats = model(x)
    raw = torch.cat([f.view(BATCH, f.shape[1], -1) for f in feats], 2)
    total, parts = detection_loss(feats, model.model[22].stride.to(dtype), make_targets(), 80, dtype)
    total.backward()
    out = {"raw_train": raw.detach().float(), "decoded_eval": decoded.float(),
           "loss": torch.cat([parts.double(), total.detach().double().view(1)])}
    sums, abs_sums, l2s, maxes, idxs, samples, names = [], [], [], [], [], [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        names.append(name)
        g = p.grad.detach().double().reshape(-1)
        sums.append(g.sum().item())
        abs_sums.append(g.abs().sum().item())
        l2s.append(g.norm().item())
        maxes.append(g.abs().max().item())
        ix = sample_index(sd_names.index(name) + 1, g.numel())
        idxs.append(ix)
        samples.append(p.grad.detach().reshape(-1)[torch.from_numpy(ix)].float())
    out["grad_sum"] = torch.tensor(sums, dtype=torch.float64)
    out["grad_abs_sum"] = torch.tensor(abs_sums, dtype=torch.float64)
    out["grad_l2"] = torch.tensor(l2s, dtype=torch.float64)
    out["grad_absmax"] = torch.tensor(maxes, dtype=torch.float64)
    out["grad_index"] = torch.from_numpy(np.stack(idxs))
    out["grad_sample"] = torch.stack(samples)
    bns = [m for m in model.modules() if isinstance(m, nn.BatchNorm2d)]
    out["running_mean"] = torch.cat([m.running_mean.detach().float() for m in bns])
    out["running_var"] = torch.cat([m.running_var.detach().float() for m in bns])
    info = {"state_dict": sd_names, "grad_parameters": names, "weight_sum": weight_sum.tolist(),
            "strides": model.model[22].stride.tolist(), "loss": parts.tolist(), "total": total.item()}
    return out, info


def assigner_case():
    """B 2, a 64x64 image with strides 8/16/32 (A = 64 + 16 + 4 = 84), 4 classes, M 3 (image 1: one padding row).
    Predicted boxes sit around each anchor with sizes near the objects'. The first generator seed for which every
    real box has at least topk candidates of positive metric is used: top-k then never reaches the zero-metric
    ties, whose order torch.topk leaves unspecified, so the outputs are a function of the formulas alone."""
    feats = [torch.zeros(1, 1, 8, 8), torch.zeros(1, 1, 4, 4), torch.zeros(1, 1, 2, 2)]
    anc, st = make_anchors(feats, [8, 16, 32])
    anc_px = anc * st
    A, nc = anc.shape[0], 4
    gt_bboxes = torch.tensor([[[4, 6, 30, 40], [20, 18, 60, 50], [34, 2, 62, 26]],
                              [[8, 8, 56, 56], [10, 30, 34, 62], [0, 0, 0, 0]]], dtype=torch.float32)
    gt_labels = torch.tensor([[[1], [3], [0]], [[2], [1], [0]]], dtype=torch.float32)
    mask_gt = torch.tensor([[[1.0], [1.0], [1.0]], [[1.0], [1.0], [0.0]]])
    tal = TaskAlignedAssigner(topk=10, num_classes=nc, alpha=0.5, beta=6.0)
    for seed in range(1000):
        g = torch.Generator().manual_seed(seed)
        half = 10 + 10 * torch.rand(2, A, 2, generator=g)
        jitter = 3 * (torch.rand(2, A, 2, generator=g) - 0.5)
        ctr = anc_px[None] + jitter
        pd_bboxes = torch.cat((ctr - half, ctr + half), -1)
        pd_scores = torch.rand(2, A, nc, generator=g) * 0.9 + 0.05
        tal.bs, tal.n_max_boxes = 2, 3
        in_gts = tal.select_candidates_in_gts(anc_px, gt_bboxes) * mask_gt
        metric, _ = tal.get_box_metrics(pd_scores, pd_bboxes, gt_labels.long(), gt_bboxes, in_gts)
        kth = metric.topk(10, dim=-1).values[..., -1]
        if bool((kth[mask_gt.squeeze(-1).bool()] > 0).all()):
            break
    else:
        raise SystemExit("assigner_case: no seed below 1000 meets the premise")
    labels, boxes, scores, fg, gt_idx = tal(pd_scores, pd_bboxes, anc_px, gt_labels, gt_bboxes, mask_gt)
    multi = int(((in_gts.sum(1)) > 1).sum())
    return {"assign.pd_scores": pd_scores, "assign.pd_bboxes": pd_bboxes, "assign.anc_points": anc_px,
            "assign.gt_labels": gt_labels.squeeze(-1), "assign.gt_bboxes": gt_bboxes,
            "assign.mask_gt": mask_gt.squeeze(-1).bool(), "assign.target_labels": labels,
            "assign.target_bboxes": boxes, "assign.target_scores": scores.float(), "assign.fg_mask": fg,
            "assign.target_gt_idx": gt_idx}, {"seed": seed, "fg": int(fg.sum()), "anchors_in_several_boxes": multi}


def ciou_case():
    g = torch.Generator().manual_seed(11)
    n = 64
    c1 = torch.rand(n, 2, generator=g) * 40
    wh1 = torch.rand(n, 2, generator=g) * 20 + 1
    c2 = c1 + (torch.rand(n, 2, generator=g) - 0.5) * 30  # overlapping, touching and disjoint pairs
    wh2 = torch.rand(n, 2, generator=g) * 20 + 1
    box1 = torch.cat((c1 - wh1 / 2, c1 + wh1 / 2), 1)
    box2 = torch.cat((c2 - wh2 / 2, c2 + wh2 / 2), 1)
    box2[0] = box1[0]            # identical boxes: CIoU 1
    box2[1] = torch.zeros(4)     # a zero box (the background target of an image without objects)
    b1 = box1.clone().requires_grad_(True)
    v = bbox_ciou(b1, box2).squeeze(-1)
    (grad,) = torch.autograd.grad(v.sum(), b1)
    return {"ciou.box1": box1, "ciou.box2": box2, "ciou.value": v.detach(), "ciou.grad1": grad}


def main():
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    out_dir = Path(sys.argv[1])
    out_dir.mkdir(parents=True, exist_ok=True)
    tensors = []
    f32, info32 = run_model(torch.float32)
    f64, info64 = run_model(torch.float64)
    for k, v in f32.items():
        tensors.append((f"yolov8n.{k}", v))
    for k in ("raw_train", "decoded_eval", "loss", "grad_sum", "grad_abs_sum", "grad_l2", "grad_absmax",
              "grad_sample"):
        tensors.append((f"yolov8n.f64.{k}", f64[k]))
    tensors.append(("targets", make_targets()))
    acase, ainfo = assigner_case()
    tensors += list(acase.items())
    tensors += list(ciou_case().items())
    counts = []
    with torch.no_grad():
        for s in "nsmlx":
            counts.append(sum(p.numel() for p in DetectionModel(s, 80, 3).parameters()))
    tensors.append(("counts", torch.tensor(counts, dtype=torch.int64)))
    meta = {"generator": "scripts/gen_yolo_golden.py", "torch": torch.__version__}
    write_safetensors(out_dir / "yolo_parity.safetensors", tensors, meta)
    manifest = {"generator": "scripts/gen_yolo_golden.py", "torch": torch.__version__, "numpy": np.__version__,
                "date": datetime.date.today().isoformat(), "input": [BATCH, 3, SIZE, SIZE],
                "counts": dict(zip("nsmlx", counts)), "yolov8n": info32,
                "f64": {"loss": info64["loss"], "total": info64["total"]}, "assign": ainfo}
    (out_dir / "yolo_parity.json").write_text(json.dumps(manifest, indent=1) + "\n")
    print("counts", counts)
    print("f32 loss", info32["loss"], "total", info32["total"])
    print("f64 loss", info64["loss"], "total", info64["total"])
    print("assigner", ainfo)
    for k in ("raw_train", "decoded_eval"):
        d = (f32[k].double() - f64[k]).abs().max().item()
        print(f"{k}: max |f32 - f64| {d:.3e}, max |f64| {f64[k].abs().max().item():.3e}")
    rel = (f32["grad_sample"].double() - f64["grad_sample"]).abs().max(1).values / f64["grad_absmax"].clamp(min=1e-30)
    print(f"grad samples: max |f32 - f64| / tensor max |g| {rel.max().item():.3e}; zero-gradient tensors:",
          [n for n, m in zip(info32["grad_parameters"], f64["grad_absmax"].tolist()) if m == 0])
    return 0


if __name__ == "__main__":
    sys.exit(main())
