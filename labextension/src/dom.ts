/**
 * Small DOM helpers for views that are updated in place rather than rebuilt.
 *
 * The panel redraws every poll. Replacing its nodes would drop keyboard focus and any state a node holds
 * (a Stop button saying "Stopping…"), and makes screen readers announce the whole panel again. So a view
 * creates its nodes once and later only writes the text and attributes that changed; lists of rows are
 * reconciled by key (see `syncList`), which keeps each row's node for as long as its key is listed.
 */

export function el<K extends keyof HTMLElementTagNameMap>(
  tag: K,
  className: string,
  text?: string
): HTMLElementTagNameMap[K] {
  const node = document.createElement(tag);
  node.className = className;
  if (text !== undefined) {
    node.textContent = text;
  }
  return node;
}

/** Set a node's text only when it differs (writing it anew would replace its text node). */
export function setText(node: Node, text: string): void {
  if (node.textContent !== text) {
    node.textContent = text;
  }
}

/** Set (or with null, remove) an attribute only when it differs. */
export function setAttr(node: Element, name: string, value: string | null): void {
  if (value === null) {
    if (node.hasAttribute(name)) {
      node.removeAttribute(name);
    }
  } else if (node.getAttribute(name) !== value) {
    node.setAttribute(name, value);
  }
}

/** Set the class attribute only when it differs. */
export function setClass(node: Element, className: string): void {
  setAttr(node, 'class', className);
}

/** Show or hide a node that stays in place (so its siblings keep their nodes too). */
export function setShown(node: HTMLElement, shown: boolean): void {
  if (node.hidden === shown) {
    node.hidden = !shown;
  }
}

/** A row of a keyed list: its node, and how to bring it up to date with a new item. */
export interface IRow<T> {
  readonly node: HTMLElement;
  update(item: T): void;
  dispose?(): void;
}

/**
 * Make `container`'s children the rows of `items`, in order, reusing the row of each key already shown.
 *
 * Rows whose key is gone are removed; new keys get a row from `create`. A kept row is moved only when it is
 * out of order, because moving a node takes focus away from whatever inside it had it.
 */
export function syncList<T>(
  container: HTMLElement,
  rows: Map<string, IRow<T>>,
  items: readonly T[],
  key: (item: T) => string,
  create: (item: T) => IRow<T>
): void {
  const wanted = new Map(items.map(item => [key(item), item] as const));
  for (const [k, row] of rows) {
    if (!wanted.has(k)) {
      row.node.remove();
      row.dispose?.();
      rows.delete(k);
    }
  }
  let previous: Node | null = null;
  for (const [k, item] of wanted) {
    let row = rows.get(k);
    if (row) {
      row.update(item);
    } else {
      row = create(item);
      row.update(item);
      rows.set(k, row);
    }
    const expected: ChildNode | null = previous ? previous.nextSibling : container.firstChild;
    if (expected !== row.node) {
      container.insertBefore(row.node, expected);
    }
    previous = row.node;
  }
}
