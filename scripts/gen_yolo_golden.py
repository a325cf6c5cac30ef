#!/usr/bin/env python3
"""Generates the YOLOv8 parity goldens from the real Ultralytics library (the peer venv: torch, ultralytics).

usage: YOLO_OFFLINE=true HF_HUB_OFFLINE=1 .venv-peer/bin/python scripts/gen_yolo_golden.py OUT_DIR
       (OUT_DIR: tests/data/models; .venv-peer/ is made by `scripts/setup --peer`, requirements/peer.txt)
Writes
  yolo_parity.safetensors   Ultralytics' numbers (below), ~1 MB
  yolo_parity.json          what was generated, how, with which library versions; state-dict keys and shapes; counts
The C++ test (src/ampforge/models/yolo_parity_test.cpp) never runs Python. Runs offline: nothing is downloaded
(no weights; the models are built from the yolov8.yaml shipped inside the ultralytics package).

What comes from Ultralytics (every number the test compares is computed by Ultralytics' own code):
  model        ultralytics.nn.tasks.DetectionModel(yaml_model_load("yolov8n.yaml" / "yolov8s.yaml")): the package's
               cfg/models/v8/yolov8.yaml at scale n / s, strides measured by its constructor
  weights      the integer hash below written into its state_dict() (the keys are Ultralytics'; ampforge's must be
               the same keys in the same order with the same shapes, none missing, none left over), then the frozen
               DFL bins of a fresh ultralytics DFL(16) and the head biases of its Detect.bias_init()
  forward      eval mode: the decoded output (first element of the model's (y, preds) output); training mode: the
               raw dict, boxes and scores concatenated (B, 64 + nc, A)
  loss         DetectionModel.loss(batch, preds) = v8DetectionLoss with the default hyperparameters of
               ultralytics.cfg.get_cfg() (box 7.5, cls 0.5, dfl 1.5); the total is what its trainer backpropagates
               (loss.sum()); gradients by torch autograd through Ultralytics' modules; BN statistics of the model
  assigner     ultralytics.utils.tal.TaskAlignedAssigner(topk 10, alpha 0.5, beta 6.0, strides 8/16/32) on a
               hand-made case (including boxes smaller than the middle stride, which Ultralytics 8.4 enlarges to it
               when it selects candidate anchors)
  CIoU         ultralytics.utils.metrics.bbox_iou(box1, box2, xywh=False, CIoU=True) and its autograd gradient
  NMS          ultralytics.utils.nms.non_max_suppression with the arguments DetectionValidator.postprocess passes
               (multi_label=True, class-aware), at the validator's defaults and at a second, truncating setting
  mAP          DetectionValidator._process_batch (box_iou + match_predictions, on a validator stub that has only
               the validator's iouv/niou) on the NMS outputs and on one hand-made image, then DetMetrics.process
               (ap_per_class, Metric) and smooth() for the confidence where the mean F1 peaks
  counts       parameters of DetectionModel for yolov8n/s/m/l/x
Nothing of Ultralytics is re-stated here. What is ours: the hash rule for weights and inputs, the targets, the
assigner/NMS/mAP test data, and the checks that the data exercise what they should (premise checks below).

Weights and inputs are not stored: both sides compute them from the integer hash of scripts/gen_resnet_golden.py
(splitmix64; same per-tensor rules: s = 1 + index in state_dict order), except the frozen DFL conv (arange(16),
Ultralytics' DFL init) and the last convs' biases of the head (Ultralytics' bias_init: box 2.0, class
log(5 / 80 / (640 / stride)^2)), so the class loss has its realistic size. The input x (2, 3, 128, 128) is the hash
stream 2^20 (c 0, a 1).

Recorded, for M in yolov8n and yolov8s (F32 unless said):
  M.raw_train               yolov8n: (2, 144, 336) training-mode output (levels flattened and concatenated)
  M.decoded_eval            yolov8n: (2, 84, 336) eval-mode output: boxes cxcywh pixels + class probabilities
  M.raw_train_index/_sample yolov8s: (4096,) I64 flat positions (splitmix64((2^20 + 2) * 2^40 + k) mod numel) and
  M.decoded_eval_index/_sample       the values there (positions: stream 2^20 + 3), instead of the whole tensors
  M.loss                    (4,) F64 [box, cls, dfl] after gains (Ultralytics' loss items) and the total
  M.grad_sum / grad_abs_sum / grad_l2 / grad_absmax   (P,) F64 per parameter (named_parameters order, the frozen
                            DFL weight excluded: it has no gradient)
  M.grad_index / grad_sample   (P, 32) positions (splitmix64(s * 2^40 + 2^39 + k) mod numel) and values
  M.running_mean / running_var  every BN's statistics after the training forward, concatenated
  targets                   (2, 4, 5) the loss's targets (class, cx, cy, w, h normalised); image 1's row 3 pads
  assign.*                  the hand-made assigner case (inputs and Ultralytics' outputs)
  ciou.box1 / box2 / value / grad1   CIoU of 64 box pairs and d(sum CIoU)/d box1
  nms.pred                  (4, 4 + 4, 40) decoded predictions of 4 images (cx, cy, w, h pixels, 4 class scores)
  nms.a.det / nms.b.det     (N, 7) [image, x1, y1, x2, y2, conf, class] non_max_suppression's outputs in order:
                            a: conf 0.001, iou 0.7, max_det 300 (the validator's); b: conf 0.25, iou 0.45,
                            max_det 3, max_nms 8
  map.gt                    (G, 6) [image, x1, y1, x2, y2, class] ground truth in pixels (images 0-3 of nms.pred,
                            image 4 the hand-made one)
  map.hand_det              (D, 6) [x1, y1, x2, y2, conf, class] image 4's detections (given, not from NMS)
  map.tp                    (N, 10) BOOL match_predictions' verdicts of nms.a.det then map.hand_det (for diagnosis;
                            ampforge keeps its verdicts inside DetectionMetrics, the test compares what they give)
  map.ap                    (C, 10) F64 ap_per_class's AP of the classes with boxes (map.classes, I64), IoU .50:.95
  map.p / map.r             (C,) F64 precision and recall where the smoothed mean F1 peaks
  map.summary               (4,) F64 [map50, map50_95, best-F1 index into linspace(0, 1, 1000), mean precision]
  map.instances             (C,) I64 boxes per class (DetMetrics.nt_per_class of those classes)
  counts                    (5,) I64 parameters of yolov8n/s/m/l/x at 80 classes
Also computed, not stored: the same models in float64 (the problem's own sensitivity to rounding; printed and
recorded in the JSON under "sensitivity", for the test's tolerance derivation). Ultralytics' loss keeps its targets,
its assigner and its (3,) loss accumulator in float32 even for a float64 model, so the float64 loss parts are
rounded to float32 and the assignment is float32's; the network, its outputs and its gradients are float64.
"""
import datetime
import json
import os
import platform
import sys
from pathlib import Path

os.environ.setdefault("YOLO_OFFLINE", "true")  # never reach the network (settings sync, downloads)
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torchvision  # noqa: E402,F401  (non_max_suppression uses torchvision.ops.nms when torchvision is imported)

import ultralytics  # noqa: E402
from ultralytics.cfg import get_cfg  # noqa: E402
from ultralytics.models.yolo.detect.val import DetectionValidator  # noqa: E402
from ultralytics.nn.modules.block import DFL  # noqa: E402
from ultralytics.nn.tasks import DetectionModel, yaml_model_load  # noqa: E402
from ultralytics.utils.metrics import DetMetrics, bbox_iou, smooth  # noqa: E402
from ultralytics.utils.nms import non_max_suppression  # noqa: E402
from ultralytics.utils.tal import TaskAlignedAssigner, make_anchors  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gen_golden import write_safetensors  # noqa: E402
from gen_resnet_golden import U64, grad_record, hashed, set_hashed_weights, splitmix64  # noqa: E402

INPUT_STREAM = 1 << 20
RAW_SAMPLE_STREAM, DECODED_SAMPLE_STREAM = INPUT_STREAM + 2, INPUT_STREAM + 3
OUTPUT_SAMPLES = 4096
BATCH, SIZE = 2, 128
MODELS = ("n", "s")
FULL_OUTPUTS = ("n",)  # the others store samples of their outputs (the file stays small)
NMS_IMAGES, NMS_CLASSES, NMS_ANCHORS = 4, 4, 40


# ---- the models ------------------------------------------------------------------------------------------------
def build(scale, nc=80):
    """Ultralytics' DetectionModel from the yolov8.yaml inside the package (yolov8<scale>.yaml picks the scale)."""
    return DetectionModel(yaml_model_load(f"yolov8{scale}.yaml"), ch=3, nc=nc, verbose=False)


def make_targets():
    # image 0: four objects; the small box centred on the stride-32 anchor (48, 48) has fewer than topk candidates,
    # so anchors of all three levels are assigned. image 1: two objects, a box 10 x 13 px (below the middle stride
    # 16: Ultralytics 8.4 selects its candidates as if it were 16 x 16) and a padding row (zeros).
    return torch.tensor([[[0, 0.30, 0.35, 0.30, 0.40], [5, 0.70, 0.60, 0.35, 0.30], [2, 0.55, 0.45, 0.50, 0.55],
                          [3, 0.375, 0.375, 0.15625, 0.15625]],
                         [[7, 0.40, 0.50, 0.45, 0.35], [1, 0.72, 0.30, 0.25, 0.28], [4, 0.60, 0.78, 0.078125, 0.1015625],
                          [0, 0.0, 0.0, 0.0, 0.0]]], dtype=torch.float32)


def ultralytics_batch(targets):
    """The padded (B, M, 5) rows -> the batch dict Ultralytics' loss reads (batch_idx, cls, normalised xywh)."""
    b, m, _ = targets.shape
    rows = [(i, targets[i, j]) for i in range(b) for j in range(m) if targets[i, j, 3] > 0 and targets[i, j, 4] > 0]
    return {"batch_idx": torch.tensor([float(i) for i, _ in rows]),
            "cls": torch.stack([r[0:1] for _, r in rows]),
            "bboxes": torch.stack([r[1:5] for _, r in rows])}


def output_samples(t, stream):
    n = t.numel()
    idx = (splitmix64(U64(stream << 40) + np.arange(OUTPUT_SAMPLES, dtype=np.uint64)) % U64(n)).astype(np.int64)
    return torch.from_numpy(idx), t.reshape(-1)[torch.from_numpy(idx)].float()


def run_model(scale, dtype):
    torch.manual_seed(0)
    model = build(scale)
    weight_sum = set_hashed_weights(model)
    det = model.model[-1]
    with torch.no_grad():  # the frozen DFL keeps its bins (Ultralytics' DFL init) on both sides
        det.dfl.conv.weight.copy_(DFL(det.reg_max).conv.weight)
    det.bias_init()  # and the head's biases are Ultralytics' (box 2.0, class log(5/nc/(640/s)^2))
    model.args = get_cfg()  # the default hyperparameters: the loss gains
    model = model.to(dtype)
    x = torch.from_numpy(hashed(INPUT_STREAM, [BATCH, 3, SIZE, SIZE], 0.0, 1.0)).to(dtype)
    sd = model.state_dict()
    sd_names = list(sd.keys())
    model.eval()
    with torch.no_grad():
        decoded = model(x)[0]
    model.train()
    preds = model(x)
    raw = torch.cat((preds["boxes"], preds["scores"]), 1)
    loss, items = model.loss(ultralytics_batch(make_targets()), preds)
    total = loss.sum()
    total.backward()
    parts = torch.stack([items[k].detach().double() for k in ("box_loss", "cls_loss", "dfl_loss")])
    out = {"raw_train": raw.detach(), "decoded_eval": decoded.detach(),
           "loss": torch.cat([parts, total.detach().double().view(1)])}
    names = [name for name, p in model.named_parameters() if p.requires_grad]  # the frozen DFL bins have no gradient
    out.update(grad_record(model, sd_names, "", dtype))
    bns = [m for m in model.modules() if isinstance(m, nn.BatchNorm2d)]
    out["running_mean"] = torch.cat([m.running_mean.detach() for m in bns])
    out["running_var"] = torch.cat([m.running_var.detach() for m in bns])
    info = {"yaml": str(model.yaml.get("yaml_file")), "scale": model.yaml.get("scale"),
            "state_dict": sd_names, "state_shapes": [list(sd[k].shape) for k in sd_names],
            "grad_parameters": names, "weight_sum": weight_sum.tolist(), "strides": det.stride.tolist(),
            "loss": parts.tolist(), "total": total.item()}
    with torch.no_grad():  # the assigner's foreground count, from the same criterion
        info["fg_anchors"] = int(model.criterion.get_assigned_targets_and_loss(preds, ultralytics_batch(make_targets()))[0][0].sum())
    return out, info


def model_records(scale, f32):
    recs = []
    p = f"yolov8{scale}."
    for k in ("raw_train", "decoded_eval"):
        if scale in FULL_OUTPUTS:
            recs.append((p + k, f32[k].float()))
        else:
            idx, val = output_samples(f32[k], RAW_SAMPLE_STREAM if k == "raw_train" else DECODED_SAMPLE_STREAM)
            recs += [(p + k + "_index", idx), (p + k + "_sample", val)]
    for k in ("loss", "grad_sum", "grad_abs_sum", "grad_l2", "grad_absmax", "grad_index"):
        recs.append((p + k, f32[k]))
    for k in ("grad_sample", "running_mean", "running_var"):
        recs.append((p + k, f32[k].float()))
    return recs


def sensitivity(f32, f64):
    """The problem's own sensitivity to rounding: Ultralytics in F32 against itself in F64."""
    out = {}
    for k in ("raw_train", "decoded_eval"):
        d = (f32[k].double() - f64[k]).abs().max().item()
        out[k] = {"max_abs_diff": d, "max_abs": f64[k].abs().max().item(),
                  "eps_of_max": d / f64[k].abs().max().item() / 2 ** -23}
    rel = (f32["grad_sample"].double() - f64["grad_sample"]).abs().max(1).values / f64["grad_absmax"].clamp(min=1e-30)
    out["grad_sample"] = {"max_diff_over_tensor_max": rel.max().item(), "eps": rel.max().item() / 2 ** -23}
    for k in ("running_mean", "running_var"):
        d = (f32[k].double() - f64[k]).abs().max().item()
        out[k] = {"max_abs_diff": d, "max_abs": f64[k].abs().max().item()}
    out["loss_rel"] = ((f32["loss"] - f64["loss"]).abs() / f64["loss"].abs()).tolist()
    return out


# ---- the assigner ------------------------------------------------------------------------------------------------
def assigner_case():
    """B 2, a 64x64 image with strides 8/16/32 (A = 64 + 16 + 4 = 84), 4 classes, M 4 (image 1: one padding row);
    boxes 3 of image 0 (8 x 10 px) and 2 of image 1 (10 x 12 px) are smaller than the middle stride, so Ultralytics
    enlarges them to 16 x 16 about their centres when it selects candidate anchors. Predicted boxes sit around each
    anchor with sizes near the objects'. The first generator seed for which top-k never has to choose among equal
    metrics is used (each real box has at least topk candidates of positive metric, or all of its candidates have a
    positive metric: then the zero-metric anchors top-k adds are not candidates and are masked out), so the outputs
    are a function of the formulas alone (torch.topk leaves the order of ties unspecified)."""
    feats = [torch.zeros(1, 1, 8, 8), torch.zeros(1, 1, 4, 4), torch.zeros(1, 1, 2, 2)]
    anc, st = make_anchors(feats, torch.tensor([8.0, 16.0, 32.0]))
    anc_px = anc * st
    A, nc = anc.shape[0], 4
    gt_bboxes = torch.tensor([[[4, 6, 30, 40], [20, 18, 60, 50], [34, 2, 62, 26], [44, 40, 52, 50]],
                              [[8, 8, 56, 56], [10, 30, 34, 62], [40, 6, 50, 18], [0, 0, 0, 0]]], dtype=torch.float32)
    gt_labels = torch.tensor([[[1], [3], [0], [2]], [[2], [1], [3], [0]]], dtype=torch.float32)
    mask_gt = torch.tensor([[[1.0], [1.0], [1.0], [1.0]], [[1.0], [1.0], [1.0], [0.0]]])
    tal = TaskAlignedAssigner(topk=10, num_classes=nc, alpha=0.5, beta=6.0, stride=[8, 16, 32])
    plain = TaskAlignedAssigner(topk=10, num_classes=nc, alpha=0.5, beta=6.0, stride=[8, 0])  # no enlargement
    real = mask_gt.squeeze(-1).bool()
    for seed in range(1000):
        g = torch.Generator().manual_seed(seed)
        half = 6 + 10 * torch.rand(2, A, 2, generator=g)
        jitter = 3 * (torch.rand(2, A, 2, generator=g) - 0.5)
        ctr = anc_px[None] + jitter
        pd_bboxes = torch.cat((ctr - half, ctr + half), -1)
        pd_scores = torch.rand(2, A, nc, generator=g) * 0.9 + 0.05
        tal.bs, tal.n_max_boxes = 2, 4
        in_gts = tal.select_candidates_in_gts(anc_px, gt_bboxes, mask_gt).float() * mask_gt
        metric, _ = tal.get_box_metrics(pd_scores, pd_bboxes, gt_labels, gt_bboxes, in_gts)
        kth = metric.topk(10, dim=-1).values[..., -1]
        zero_candidates = ((metric == 0) & in_gts.bool()).sum(-1)
        if bool(((kth > 0) | (zero_candidates == 0))[real].all()):
            break
    else:
        raise SystemExit("assigner_case: no seed below 1000 meets the premise")
    labels, boxes, scores, fg, gt_idx = tal(pd_scores, pd_bboxes, anc_px, gt_labels, gt_bboxes, mask_gt)
    plain.bs, plain.n_max_boxes = 2, 4
    in_plain = plain.select_candidates_in_gts(anc_px, gt_bboxes, mask_gt).float() * mask_gt
    info = {"seed": seed, "fg": int(fg.sum()), "anchors_in_several_boxes": int((in_gts.sum(1) > 1).sum()),
            "candidates": in_gts.sum(-1).int().tolist(), "candidates_without_enlargement": in_plain.sum(-1).int().tolist(),
            "fg_per_box": [[int(((gt_idx[b] == m) & fg[b]).sum()) for m in range(4)] for b in range(2)]}
    if info["candidates"] == info["candidates_without_enlargement"]:
        raise SystemExit("assigner_case: the small boxes do not exercise the enlargement")
    return {"assign.pd_scores": pd_scores, "assign.pd_bboxes": pd_bboxes, "assign.anc_points": anc_px,
            "assign.gt_labels": gt_labels.squeeze(-1), "assign.gt_bboxes": gt_bboxes,
            "assign.mask_gt": mask_gt.squeeze(-1).bool(), "assign.target_labels": labels,
            "assign.target_bboxes": boxes, "assign.target_scores": scores.float(), "assign.fg_mask": fg,
            "assign.target_gt_idx": gt_idx}, info


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
    v = bbox_iou(b1, box2, xywh=False, CIoU=True).squeeze(-1)
    (grad,) = torch.autograd.grad(v.sum(), b1)
    return {"ciou.box1": box1, "ciou.box2": box2, "ciou.value": v.detach(), "ciou.grad1": grad}


# ---- NMS and mAP -------------------------------------------------------------------------------------------------
NMS_A = {"conf_thres": 0.001, "iou_thres": 0.7, "max_det": 300, "max_nms": 30000}  # DetectionValidator's defaults
NMS_B = {"conf_thres": 0.25, "iou_thres": 0.45, "max_det": 3, "max_nms": 8}


def nms_data(seed):
    """4 images of 128 x 128 px, 4 classes, 40 anchors each. Classes 0 and 1 have boxes and predictions, class 2 only
    predictions, class 3 one box and no prediction above any threshold (an AP-0 row). Each object gets 6 jittered
    predictions (its class 0.2-0.95, the others 0-0.01: low multi-label candidates), the other anchors random boxes
    with one class at 0-0.3. Coordinates are multiples of 1/16 px and sizes at most 96 px, so every box corner, area,
    intersection and union (also with the 7680-px class offset of Ultralytics' NMS) is exact in F32 and the IoUs are
    correctly rounded quotients on both sides."""
    g = torch.Generator().manual_seed(seed)
    rnd = lambda *s: torch.rand(*s, generator=g)  # noqa: E731
    q = lambda t: torch.round(t * 16) / 16  # noqa: E731
    pred = torch.zeros(NMS_IMAGES, 4 + NMS_CLASSES, NMS_ANCHORS)
    gts = []
    for b in range(NMS_IMAGES):
        n_obj = 2 + b % 3
        a = 0
        for o in range(n_obj):
            cls = 3 if (b == 2 and o == n_obj - 1) else int(rnd(1) < 0.5)
            wh = torch.round((16 + 48 * rnd(2)) * 8) / 8  # multiples of 1/8: corners of 1/16
            ctr = q(wh / 2 + (128 - wh) * rnd(2))
            gts.append([b, *(ctr - wh / 2).tolist(), *(ctr + wh / 2).tolist(), cls])
            if cls == 3:
                continue
            for _ in range(6):
                pwh = q(wh * (0.8 + 0.45 * rnd(2)) / 2) * 2
                pc = q(ctr + (rnd(2) - 0.5) * 0.3 * wh)
                pred[b, 0:2, a], pred[b, 2:4, a] = pc, pwh
                pred[b, 4:4 + 3, a] = 0.01 * rnd(3)
                pred[b, 4 + cls, a] = 0.2 + 0.75 * rnd(1)
                a += 1
        for a in range(a, NMS_ANCHORS):
            pwh = q(8 + 88 * rnd(2) / 2) * 2
            pwh = pwh.clamp(max=96)
            pc = q(pwh / 2 + (128 - pwh) * rnd(2))
            pred[b, 0:2, a], pred[b, 2:4, a] = pc, pwh
            pred[b, 4:4 + 3, a] = 0.002 * rnd(3)
            pred[b, 4 + int(3 * rnd(1)), a] = 0.3 * rnd(1)
    return pred, torch.tensor(gts, dtype=torch.float32)


def run_nms(pred, cfg):
    out = non_max_suppression(pred.clone(), cfg["conf_thres"], cfg["iou_thres"], multi_label=True, agnostic=False,
                              max_det=cfg["max_det"], nc=0, max_nms=cfg["max_nms"])
    return torch.cat([torch.cat((torch.full((len(o), 1), float(b)), o), 1) for b, o in enumerate(out)])


def box_iou64(a, b):
    """IoU in float64 of xyxy rows (for the premise checks only)."""
    a, b = a.double(), b.double()
    lt = torch.max(a[:, None, :2], b[None, :, :2])
    rb = torch.min(a[:, None, 2:], b[None, :, 2:])
    inter = (rb - lt).clamp(min=0).prod(-1)
    area = lambda x: (x[:, 2:] - x[:, :2]).prod(-1)  # noqa: E731
    return inter / (area(a)[:, None] + area(b)[None, :] - inter)


def hand_image():
    """Image 4: two class-0 boxes A [10,10,50,50] and B [30,10,70,50]; detection p1 (0.9) has IoU 0.538 with A and
    0.667 with B, p2 (0.8) is B (IoU 1; 0.333 with A). Ultralytics 8.4 matches in confidence order (p1 takes B for
    thresholds up to 0.65, so p2 is a miss there), a greedy match in IoU order would give p2 B and p1 A at 0.50."""
    gt = torch.tensor([[4, 10, 10, 50, 50, 0], [4, 30, 10, 70, 50, 0]], dtype=torch.float32)
    det = torch.tensor([[22, 10, 62, 50, 0.9, 0], [30, 10, 70, 50, 0.8, 0]], dtype=torch.float32)
    return gt, det


def map_case(nms_det, gts):
    hand_gt, hand_det = hand_image()
    gts = torch.cat((gts, hand_gt))
    validator = DetectionValidator.__new__(DetectionValidator)  # only what _process_batch reads
    validator.iouv = torch.linspace(0.5, 0.95, 10)  # as DetectionValidator.__init__
    validator.niou = validator.iouv.numel()
    metrics = DetMetrics(names={i: str(i) for i in range(NMS_CLASSES)})
    tps = []
    for b in range(NMS_IMAGES + 1):
        d = nms_det[nms_det[:, 0] == b, 1:] if b < NMS_IMAGES else hand_det
        t = gts[gts[:, 0] == b]
        preds = {"bboxes": d[:, :4], "conf": d[:, 4], "cls": d[:, 5]}
        batch = {"bboxes": t[:, 1:5], "cls": t[:, 5]}
        stat = validator._process_batch(preds, batch)
        tps.append(torch.from_numpy(stat["tp"]))
        cls = batch["cls"].numpy()
        metrics.update_stats({**stat, "target_cls": cls, "target_img": np.unique(cls), "conf": d[:, 4].numpy(),
                              "pred_cls": d[:, 5].numpy(), "im_name": f"image{b}"})
    metrics.process()
    box = metrics.box
    best = int(smooth(box.f1_curve.mean(0), 0.1).argmax())
    classes = np.asarray(box.ap_class_index, dtype=np.int64)
    rec = {"map.gt": gts, "map.hand_det": hand_det, "map.tp": torch.cat(tps),
           "map.ap": torch.from_numpy(np.asarray(box.all_ap, dtype=np.float64)),
           "map.classes": torch.from_numpy(classes),
           "map.p": torch.from_numpy(np.asarray(box.p, dtype=np.float64)),
           "map.r": torch.from_numpy(np.asarray(box.r, dtype=np.float64)),
           "map.summary": torch.tensor([box.map50, box.map, float(best), box.mp], dtype=torch.float64),
           "map.instances": torch.from_numpy(metrics.nt_per_class[classes].astype(np.int64))}
    return rec


def nms_premises(pred, gts, det_a):
    """The NMS/mAP data exercise what the test claims, and no decision sits on a tie."""
    info = {}
    for b in range(NMS_IMAGES):
        scores = pred[b, 4:].flatten()
        cand = scores[scores > NMS_A["conf_thres"]]
        if len(torch.unique(cand)) != len(cand):
            return None
    all_conf = det_a[:, 5]
    hand = hand_image()[1][:, 4]
    if len(torch.unique(torch.cat((all_conf, hand)))) != len(all_conf) + len(hand):
        return None  # ap_per_class sorts with an unstable argsort
    # matching: no same-class (box, detection) IoU within 1e-6 of a threshold
    thr = torch.linspace(0.5, 0.95, 10).double()
    for b in range(NMS_IMAGES):
        d = det_a[det_a[:, 0] == b]
        t = gts[gts[:, 0] == b]
        iou = box_iou64(t[:, 1:5], d[:, 1:5]) * (t[:, 5:6] == d[None, :, 6])
        if ((iou[..., None] - thr).abs() < 1e-6).any():
            return None
    info["nms_a_per_image"] = [int((det_a[:, 0] == b).sum()) for b in range(NMS_IMAGES)]
    info["candidates_a"] = [int((pred[b, 4:] > NMS_A["conf_thres"]).sum()) for b in range(NMS_IMAGES)]
    info["candidates_b"] = [int((pred[b, 4:] > NMS_B["conf_thres"]).sum()) for b in range(NMS_IMAGES)]
    return info


def nms_cases():
    for seed in range(200):
        pred, gts = nms_data(seed)
        det_a = run_nms(pred, NMS_A)
        info = nms_premises(pred, gts, det_a)
        if info is None:
            continue
        det_b = run_nms(pred, NMS_B)
        # the second setting truncates: more candidates than max_nms in some image, max_det reached in some image
        if not (max(info["candidates_b"]) > NMS_B["max_nms"] and
                max(int((det_b[:, 0] == b).sum()) for b in range(NMS_IMAGES)) == NMS_B["max_det"]):
            continue
        info["seed"] = seed
        info["nms_b_per_image"] = [int((det_b[:, 0] == b).sum()) for b in range(NMS_IMAGES)]
        recs = {"nms.pred": pred, "nms.a.det": det_a, "nms.b.det": det_b}
        recs.update(map_case(det_a, gts))
        return recs, info
    raise SystemExit("nms_cases: no seed below 200 meets the premises")


# ---- main ------------------------------------------------------------------------------------------------------------
def main():
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    torch.set_num_threads(1)
    out_dir = Path(sys.argv[1])
    out_dir.mkdir(parents=True, exist_ok=True)
    tensors, models, sens = [], {}, {}
    for scale in MODELS:
        f32, info32 = run_model(scale, torch.float32)
        f64, info64 = run_model(scale, torch.float64)
        tensors += model_records(scale, f32)
        models[f"yolov8{scale}"] = info32
        sens[f"yolov8{scale}"] = sensitivity(f32, f64)
        sens[f"yolov8{scale}"]["f64_loss"] = info64["loss"] + [info64["total"]]
    tensors.append(("targets", make_targets()))
    acase, ainfo = assigner_case()
    tensors += list(acase.items())
    tensors += list(ciou_case().items())
    ncase, ninfo = nms_cases()
    tensors += list(ncase.items())
    counts = []
    with torch.no_grad():
        for s in "nsmlx":
            counts.append(sum(p.numel() for p in build(s).parameters()))
    tensors.append(("counts", torch.tensor(counts, dtype=torch.int64)))
    versions = {"ultralytics": ultralytics.__version__, "torch": torch.__version__,
                "torchvision": torchvision.__version__, "numpy": np.__version__, "python": platform.python_version()}
    meta = {"generator": "scripts/gen_yolo_golden.py", **versions}
    write_safetensors(out_dir / "yolo_parity.safetensors", tensors, meta)
    manifest = {"generator": "scripts/gen_yolo_golden.py", "reference": "ultralytics (real library, offline)",
                "versions": versions, "date": datetime.date.today().isoformat(), "input": [BATCH, 3, SIZE, SIZE],
                "counts": dict(zip("nsmlx", counts)), **models, "sensitivity": sens, "assign": ainfo,
                "nms": {"a": NMS_A, "b": NMS_B, **ninfo},
                "map": {"classes": ncase["map.classes"].tolist(), "summary": ncase["map.summary"].tolist()}}
    (out_dir / "yolo_parity.json").write_text(json.dumps(manifest, indent=1) + "\n")
    print("versions", versions)
    print("counts", counts)
    for m, i in models.items():
        print(m, "loss", i["loss"], "total", i["total"], "fg", i["fg_anchors"])
    print("sensitivity", json.dumps(sens, indent=1))
    print("assigner", ainfo)
    print("nms", ninfo)
    print("map", manifest["map"], "ap", ncase["map.ap"].tolist())
    return 0


if __name__ == "__main__":
    sys.exit(main())
