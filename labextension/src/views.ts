/**
 * Pieces the panel's sections share: a titled section with a keyed list of rows and a line shown when the
 * list is empty, and a link that opens a notebook. Both are made once and updated in place (see dom.ts).
 */
import { el, IRow, setAttr, setShown, setText, syncList } from './dom';

/** A section: title, an optional note, the rows, and a line for when there are none. */
export class Section<T> {
  readonly node: HTMLElement;

  constructor(
    className: string,
    private _key: (item: T) => string,
    private _create: (item: T) => IRow<T>
  ) {
    this.node = el('section', `nbtrain-Section ${className}`);
    this.node.append(this._title, this.note, this._list, this._empty);
    setShown(this.note, false);
  }

  /** A line under the title (hidden until given text). */
  readonly note = el('div', 'nbtrain-Note');

  update(title: string, items: readonly T[], emptyText: string): void {
    setText(this._title, title);
    syncList(this._list, this._rows, items, this._key, this._create);
    setText(this._empty, emptyText);
    setShown(this._empty, items.length === 0);
  }

  private _title = el('h3', 'nbtrain-Section-title');
  private _list = el('div', 'nbtrain-Section-rows');
  private _empty = el('div', 'nbtrain-Empty');
  private _rows = new Map<string, IRow<T>>();
}

/** The notebook's file name, opening it on click; "kernel 1a2b3c4d" when the kernel has no notebook. */
export class NotebookLink {
  readonly node = el('a', 'nbtrain-Notebook');

  constructor(open: (path: string) => void) {
    this.node.onclick = event => {
      event.preventDefault();
      if (this._path) {
        open(this._path);
      }
    };
  }

  update(path: string | null, kernelId: string): void {
    this._path = path;
    setText(this.node, path ? (path.split('/').pop() ?? path) : `kernel ${kernelId.slice(0, 8)}`);
    setAttr(this.node, 'title', path ? `Open ${path}` : null);
    // Without an href the element is plain text: not focusable, not announced as a link.
    setAttr(this.node, 'href', path ? '#' : null);
  }

  private _path: string | null = null;
}
