/**
 * The one way the extension talks to nbtrain's server routes (`<base_url>/nbtrain/...`).
 */
import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';

import { IErrorReply } from './types';

/**
 * Call a route of nbtrain's server extension and return its JSON.
 *
 * Throws a ServerConnection.ResponseError whose message is the server's explanation (for example why a
 * stop request was refused).
 */
export async function requestAPI<T>(endPoint: string, init: RequestInit = {}): Promise<T> {
  const settings = ServerConnection.makeSettings();
  const url = URLExt.join(settings.baseUrl, 'nbtrain', endPoint);
  let response: Response;
  try {
    response = await ServerConnection.makeRequest(url, init, settings);
  } catch (error) {
    throw new ServerConnection.NetworkError(error as TypeError);
  }
  const text = await response.text();
  let data: any = text;
  if (text.length > 0) {
    try {
      data = JSON.parse(text);
    } catch {
      // Not JSON (a proxy's error page): keep the text for the message below.
    }
  }
  if (!response.ok) {
    const reply = typeof data === 'object' ? (data as IErrorReply | null) : null;
    const message = reply?.message || `${response.status} ${response.statusText}`;
    throw new ServerConnection.ResponseError(response, message);
  }
  return data as T;
}
