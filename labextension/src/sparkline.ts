/**
 * A tiny SVG line chart of percentages (0–100), newest value on the right.
 */
const SVG = 'http://www.w3.org/2000/svg';

export function sparkline(values: number[], className: string, width = 120, height = 22): SVGSVGElement {
  const svg = document.createElementNS(SVG, 'svg');
  svg.setAttribute('class', `nbtrain-Sparkline ${className}`);
  svg.setAttribute('width', String(width));
  svg.setAttribute('height', String(height));
  svg.setAttribute('viewBox', `0 0 ${width} ${height}`);
  const frame = document.createElementNS(SVG, 'rect');
  frame.setAttribute('width', String(width));
  frame.setAttribute('height', String(height));
  frame.setAttribute('class', 'nbtrain-Sparkline-frame');
  svg.appendChild(frame);
  if (values.length > 0) {
    // A single sample is drawn as a flat line so the value is visible at once.
    const points = values.length === 1 ? [values[0], values[0]] : values;
    const step = width / (points.length - 1);
    const line = document.createElementNS(SVG, 'polyline');
    line.setAttribute(
      'points',
      points
        .map((v, i) => {
          const clamped = Math.min(100, Math.max(0, v));
          return `${(i * step).toFixed(1)},${(height - 1 - (clamped / 100) * (height - 2)).toFixed(1)}`;
        })
        .join(' ')
    );
    svg.appendChild(line);
  }
  return svg;
}
