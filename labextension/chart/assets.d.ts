// esbuild bundles CSS as text (`--loader:.css=text` in package.json's build:chart): an import of a .css file is
// its text.
declare module "*.css" {
  const text: string;
  export default text;
}
