// ESLint for the JavaScript the Python package ships (nbtrain/ui/static: the chat widget's anywidget module).
// It lives here, above nbtrain/, because ESLint lints only files below its config; the lab extension's
// packages are its own (labextension/node_modules), so they are imported from there. Run by `make labext`
// (labextension/package.json's lint script).
import js from './labextension/node_modules/@eslint/js/src/index.js';
import globals from './labextension/node_modules/globals/index.js';

export default [
  { ...js.configs.recommended, files: ['nbtrain/ui/static/**/*.js'] },
  {
    files: ['nbtrain/ui/static/**/*.js'],
    languageOptions: { sourceType: 'module', ecmaVersion: 2022, globals: globals.browser },
    rules: { eqeqeq: 'error', 'no-unused-vars': ['error', { argsIgnorePattern: '^_' }] }
  }
];
