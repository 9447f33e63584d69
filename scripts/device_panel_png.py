"""Picture of the device panel from its HTML (how docs/device-panel.png is made).

    python scripts/verify_gpu_health.py --out build/gpu-health        # on a GPU machine: the panel while busy
    python scripts/device_panel_png.py build/gpu-health/device_panel.html docs/device-panel.png

The HTML is what :func:`nbtrain.kernel.dashboard.devices_view.devices_html` drew from real NVML readings; this only
renders it in headless Chromium (Debian's ``chromium``, through playwright) at the width of a notebook cell.
"""

from __future__ import annotations

import argparse
import os
import sys

CHROMIUM = os.environ.get("NBTRAIN_CHROMIUM", "/usr/bin/chromium")


def render(html: str, png: str, width: int = 900) -> None:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM)
        try:
            page = browser.new_page(viewport={"width": width, "height": 200}, device_scale_factor=2)
            page.set_content(f'<body style="margin:12px;background:#fff"><div id="panel">{html}</div></body>')
            page.locator("#panel").screenshot(path=png)
        finally:
            browser.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("html", help="device_panel.html written by scripts/verify_gpu_health.py")
    parser.add_argument("png", help="where to write the picture")
    args = parser.parse_args()
    with open(args.html) as f:
        render(f.read(), args.png)
    print(f"saved {args.png} ({os.path.getsize(args.png) // 1024} KiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
