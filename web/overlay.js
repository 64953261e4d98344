// Draws detections (boxes, labels, confidence, track ids, keypoints), zones and counting lines over the video.
// Coordinates from the server are normalised 0..1 of the analysed frame; the video is letterboxed
// (object-fit: contain), so everything is mapped into the picture's rectangle on the canvas.

// COCO-17 keypoint skeleton (Ultralytics pose models).
const SKELETON = [[15, 13], [13, 11], [16, 14], [14, 12], [11, 12], [5, 11], [6, 12], [5, 6], [5, 7], [6, 8],
  [7, 9], [8, 10], [1, 2], [0, 1], [0, 2], [1, 3], [2, 4], [3, 5], [4, 6]];
const KEYPOINT_MIN_CONF = 0.5;
const FLASH_MS = 1500;
const UNCONFIRMED_COLOUR = "#94a3b8";

function colourFor(object) {
  const key = object.track_id ?? object.class_id ?? 0;
  return `hsl(${(key * 67) % 360} 90% 60%)`;
}

export class Overlay {
  constructor(canvas, video) {
    this.canvas = canvas;
    this.video = video;
    this.context = canvas.getContext("2d");
    this.detections = null;
    this.zones = [];
    this.lines = [];
    this.flashes = new Map(); // zone or line name -> time the event arrived
    this.labelBoxes = []; // labels placed in the current draw, to avoid stacking them
    this.lastDrawn = { boxes: 0, unconfirmed: 0, labels: [], keypoints: 0, zones: 0, lines: 0 };
    new ResizeObserver(() => this.draw()).observe(canvas);
  }

  setScene({ zones = [], lines = [] }) { this.zones = zones; this.lines = lines; this.draw(); }

  setDetections(detections) { this.detections = detections; this.draw(); }

  flash(name) {
    this.flashes.set(name, performance.now());
    this.draw();
    setTimeout(() => this.draw(), FLASH_MS + 50);
  }

  clear() { this.detections = null; this.zones = []; this.lines = []; this.draw(); }

  /** The picture's rectangle inside the canvas, in CSS pixels. */
  pictureRect(width, height) {
    const frameWidth = this.video.videoWidth || this.detections?.width || 4;
    const frameHeight = this.video.videoHeight || this.detections?.height || 3;
    const scale = Math.min(width / frameWidth, height / frameHeight);
    const w = frameWidth * scale;
    const h = frameHeight * scale;
    return { x: (width - w) / 2, y: (height - h) / 2, w, h };
  }

  draw() {
    const canvas = this.canvas;
    const ratio = window.devicePixelRatio || 1;
    const width = canvas.clientWidth;
    const height = canvas.clientHeight;
    if (canvas.width !== Math.round(width * ratio) || canvas.height !== Math.round(height * ratio)) {
      canvas.width = Math.round(width * ratio);
      canvas.height = Math.round(height * ratio);
    }
    const g = this.context;
    g.setTransform(ratio, 0, 0, ratio, 0, 0);
    g.clearRect(0, 0, width, height);
    const rect = this.pictureRect(width, height);
    const at = ([x, y]) => [rect.x + x * rect.w, rect.y + y * rect.h];
    if (!this.video.videoWidth && this.detections) { // a server-side source: show where the frame is
      g.fillStyle = "#0b1220";
      g.fillRect(rect.x, rect.y, rect.w, rect.h);
      g.strokeStyle = "#334155";
      g.lineWidth = 1;
      g.strokeRect(rect.x, rect.y, rect.w, rect.h);
    }
    this.labelBoxes = [];
    const now = performance.now();
    const flashing = (name) => now - (this.flashes.get(name) ?? -Infinity) < FLASH_MS;

    for (const zone of this.zones) {
      g.beginPath();
      zone.polygon.forEach((point, index) => (index ? g.lineTo(...at(point)) : g.moveTo(...at(point))));
      g.closePath();
      g.fillStyle = flashing(zone.name) ? "rgba(251, 191, 36, 0.45)" : "rgba(96, 165, 250, 0.12)";
      g.fill();
      g.lineWidth = 2;
      g.strokeStyle = flashing(zone.name) ? "#fbbf24" : "#60a5fa";
      g.stroke();
      this.label(g, zone.name, ...at(zone.polygon[0]), g.strokeStyle, "#0f172a");
    }
    for (const line of this.lines) {
      g.beginPath();
      g.moveTo(...at(line.start));
      g.lineTo(...at(line.end));
      g.lineWidth = flashing(line.name) ? 5 : 3;
      g.strokeStyle = flashing(line.name) ? "#fbbf24" : "#c084fc";
      g.setLineDash([10, 6]);
      g.stroke();
      g.setLineDash([]);
      this.label(g, line.name, ...at(line.start), g.strokeStyle, "#0f172a");
    }

    const objects = this.detections ? this.detections.objects : [];
    let keypointsDrawn = 0;
    for (const object of objects) {
      // Unconfirmed (video.objects: too weak to track, or its track's scores not yet at the threshold): seen,
      // but it raises no event. Drawn grey and dashed, its label ending in "?".
      const unconfirmed = object.confirmed === false;
      const colour = unconfirmed ? UNCONFIRMED_COLOUR : colourFor(object);
      const [x1, y1] = at([object.box[0], object.box[1]]);
      const [x2, y2] = at([object.box[2], object.box[3]]);
      g.lineWidth = unconfirmed ? 1.5 : 2.5;
      g.strokeStyle = colour;
      g.setLineDash(unconfirmed ? [6, 4] : []);
      g.strokeRect(x1, y1, x2 - x1, y2 - y1);
      g.setLineDash([]);
      const track = object.track_id != null ? ` #${object.track_id}` : "";
      // Who (video.faces) and which (video.plates): the name instead of the label once known.
      const who = object.identity?.name ?? (object.plate ? (object.plate.name ?? object.plate.text) : null);
      const name = who ? `${who} (${object.label})` : object.label;
      const doubt = unconfirmed ? " ?" : "";
      this.label(g, `${name}${track} ${Math.round(object.conf * 100)}%${doubt}`, x1, y1, colour, "#0f172a", y2);
      if (object.keypoints) {
        const points = object.keypoints.map(([x, y, conf]) => [...at([x, y]), conf]);
        g.lineWidth = 2;
        for (const [a, b] of SKELETON) {
          const [ax, ay, ac] = points[a] || [];
          const [bx, by, bc] = points[b] || [];
          if (ac >= KEYPOINT_MIN_CONF && bc >= KEYPOINT_MIN_CONF) {
            g.beginPath(); g.moveTo(ax, ay); g.lineTo(bx, by); g.stroke();
          }
        }
        g.fillStyle = "#fff";
        for (const [x, y, conf] of points) {
          if (conf < KEYPOINT_MIN_CONF) continue;
          g.beginPath(); g.arc(x, y, 3, 0, 2 * Math.PI); g.fill();
          keypointsDrawn += 1;
        }
      }
    }
    this.lastDrawn = {
      boxes: objects.length,
      unconfirmed: objects.filter((o) => o.confirmed === false).length,
      labels: objects.map((o) => o.label),
      keypoints: keypointsDrawn,
      zones: this.zones.length,
      lines: this.lines.length,
    };
    // Tests and people with dev tools can read what was drawn without decoding pixels.
    canvas.dataset.boxes = String(objects.length);
    canvas.dataset.unconfirmed = String(this.lastDrawn.unconfirmed);
    canvas.dataset.labels = this.lastDrawn.labels.join(",");
  }

  label(g, text, x, y, background, foreground, bottom = null) {
    g.font = "600 13px system-ui, sans-serif";
    const width = g.measureText(text).width + 8;
    let top = Math.max(y - 18, 0);
    // Neighbours' labels would cover each other above the boxes: put this one under its box instead.
    const overlaps = (t) => this.labelBoxes.some(
      (b) => x < b.x + b.w && b.x < x + width && t < b.y + 18 && b.y < t + 18);
    if (bottom !== null && overlaps(top)) top = bottom;
    this.labelBoxes.push({ x, y: top, w: width });
    g.fillStyle = background;
    g.fillRect(x, top, width, 18);
    g.fillStyle = foreground;
    g.fillText(text, x + 4, top + 13);
  }
}
