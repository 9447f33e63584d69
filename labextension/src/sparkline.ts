/**
 * A tiny SVG line chart of percentages (0–100). It fills its box's width; the newest value is on the right
 * and a short history starts part-way, so the time scale stays the same while history fills up.
 *
 * The chart is made once (`createSparkline`) and redrawn in place (`drawSparkline`): only the line's
 * `points` attribute changes from one poll to the next.
 */
import { setAttr } from './dom';

const SVG = 'http://www.w3.org/2000/svg';
const WIDTH = 100; // viewBox units; the chart is stretched to its box
const HEIGHT = 24;

export function createSparkline(className: string): SVGSVGElement {
  const svg = document.createElementNS(SVG, 'svg');
  svg.setAttribute('class', `nbtrain-Sparkline ${className}`);
  svg.setAttribute('viewBox', `0 0 ${WIDTH} ${HEIGHT}`);
  svg.setAttribute('preserveAspectRatio', 'none');
  const frame = document.createElementNS(SVG, 'rect');
  frame.setAttribute('width', String(WIDTH));
  frame.setAttribute('height', String(HEIGHT));
  frame.setAttribute('class', 'nbtrain-Sparkline-frame');
  const line = document.createElementNS(SVG, 'polyline');
  line.setAttribute('vector-effect', 'non-scaling-stroke');
  svg.append(frame, line);
  return svg;
}

export function drawSparkline(svg: SVGSVGElement, values: number[], capacity: number): void {
  const line = svg.querySelector('polyline');
  if (line) {
    setAttr(line, 'points', points(values, capacity));
  }
}

function points(values: number[], capacity: number): string {
  if (values.length === 0) {
    return '';
  }
  const slots = Math.max(capacity, values.length, 2) - 1;
  // A single sample is drawn as a short flat line so the value is visible at once.
  const shown = values.length === 1 ? [values[0], values[0]] : values;
  const first = slots - (shown.length - 1);
  return shown
    .map((v, i) => {
      const y = HEIGHT - 1 - (Math.min(100, Math.max(0, v)) / 100) * (HEIGHT - 2);
      return `${(((first + i) / slots) * WIDTH).toFixed(2)},${y.toFixed(2)}`;
    })
    .join(' ');
}
