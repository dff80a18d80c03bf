// Lint the extension's TypeScript (type-aware rules: floating promises, unsafe any, ...).
import js from '@eslint/js';
import tseslint from 'typescript-eslint';

export default tseslint.config(
  { ignores: ['lib/**', 'build-test/**', 'node_modules/**', 'style/**'] },
  js.configs.recommended,
  ...tseslint.configs.recommendedTypeChecked,
  {
    languageOptions: {
      parserOptions: {
        project: ['./tsconfig.json', './tsconfig.test.json'],
        tsconfigRootDir: import.meta.dirname
      }
    },
    rules: {
      '@typescript-eslint/no-floating-promises': 'error',
      '@typescript-eslint/no-explicit-any': 'off',
      '@typescript-eslint/no-unsafe-assignment': 'off',
      '@typescript-eslint/no-unsafe-member-access': 'off',
      // Lumino's signal.connect(this._method, this) passes `this` explicitly.
      '@typescript-eslint/unbound-method': 'off',
      '@typescript-eslint/no-unused-vars': ['error', { argsIgnorePattern: '^_' }],
      eqeqeq: 'error',
      curly: 'error'
    }
  },
  // node:test's test() returns a promise the runner itself awaits.
  { files: ['test/**'], rules: { '@typescript-eslint/no-floating-promises': 'off' } },
  { files: ['eslint.config.mjs'], ...tseslint.configs.disableTypeChecked }
);
