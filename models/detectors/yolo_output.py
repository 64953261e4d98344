"""Decoding a YOLO model's raw output tensor into Vigil's detections, for the backends that run the exported model
themselves (Triton, OpenVINO): Ultralytics' own NMS and box/keypoint scaling, as its torch predictor applies them,
so every backend answers with the same detections for the same image."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from models.detectors import Detection


@dataclass(frozen=True)
class YoloOutput:
    """What decoding needs to know of the model and of the request."""

    names: dict[int, str]
    task: str  # "detect" or "pose"
    kpt_shape: tuple[int, int]
    conf: float
    iou: float
    classes: list[int] | None
    max_det: int

    def decode(self, raw: np.ndarray, input_hw: tuple[int, ...],
               shapes: list[tuple[int, ...]]) -> list[list[Detection]]:
        """``raw``: the model's output for a batch letterboxed to ``input_hw``; ``shapes``: each image's own."""
        import torch
        from ultralytics.utils import nms, ops

        predictions = nms.non_max_suppression(
            torch.from_numpy(np.array(raw)),  # a copy: a client's buffer may be read-only
            self.conf, self.iou, self.classes, False, max_det=self.max_det,
            nc=len(self.names) if self.task == "pose" else 0,
        )
        out: list[list[Detection]] = []
        for pred, shape in zip(predictions, shapes, strict=True):
            height, width = shape[:2]
            boxes = ops.scale_boxes(input_hw, pred[:, :4].clone(), shape).numpy()
            keypoints = None
            if self.task == "pose":
                kpts = pred[:, 6:].view(pred.shape[0], *self.kpt_shape)
                keypoints = ops.scale_coords(input_hw, kpts.clone(), shape).numpy()
            scale = np.array([width, height, width, height], dtype=np.float32)
            detections = []
            for i, (box, conf, cls) in enumerate(zip(boxes / scale, pred[:, 4].numpy(), pred[:, 5].numpy(),
                                                     strict=True)):
                points = None
                if keypoints is not None:
                    k = keypoints[i]
                    conf_k = k[:, 2] if k.shape[1] > 2 else np.ones(len(k))
                    points = [(float(x / width), float(y / height), float(c))
                              for (x, y), c in zip(k[:, :2], conf_k, strict=True)]
                class_id = int(cls)
                detections.append(Detection(
                    label=self.names.get(class_id, f"class{class_id}"), class_id=class_id, conf=float(conf),
                    box=tuple(float(v) for v in np.clip(box, 0.0, 1.0)),  # type: ignore[arg-type]
                    keypoints=points,
                ))
            out.append(detections)
        return out
