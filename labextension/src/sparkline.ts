/**
 * A tiny SVG line chart of percentages (0–100). It fills its box's width; the newest value is on the right
 * and a short history starts part-way, so the time scale stays the same while history fills up.
 */
const SVG = 'http://www.w3.org/2000/svg';
const WIDTH = 100; // viewBox units; the chart is stretched to its box
const HEIGHT = 24;

export function sparkline(values: number[], capacity: number, className: string): SVGSVGElement {
  const svg = document.createElementNS(SVG, 'svg');
  svg.setAttribute('class', `nbtrain-Sparkline ${className}`);
  svg.setAttribute('viewBox', `0 0 ${WIDTH} ${HEIGHT}`);
  svg.setAttribute('preserveAspectRatio', 'none');
  const frame = document.createElementNS(SVG, 'rect');
  frame.setAttribute('width', String(WIDTH));
  frame.setAttribute('height', String(HEIGHT));
  frame.setAttribute('class', 'nbtrain-Sparkline-frame');
  svg.appendChild(frame);
  if (values.length > 0) {
    const slots = Math.max(capacity, values.length, 2) - 1;
    // A single sample is drawn as a short flat line so the value is visible at once.
    const points = values.length === 1 ? [values[0], values[0]] : values;
    const first = slots - (points.length - 1);
    const line = document.createElementNS(SVG, 'polyline');
    line.setAttribute(
      'points',
      points
        .map((v, i) => {
          const y = HEIGHT - 1 - (Math.min(100, Math.max(0, v)) / 100) * (HEIGHT - 2);
          return `${(((first + i) / slots) * WIDTH).toFixed(2)},${y.toFixed(2)}`;
        })
        .join(' ')
    );
    line.setAttribute('vector-effect', 'non-scaling-stroke');
    svg.appendChild(line);
  }
  return svg;
}
