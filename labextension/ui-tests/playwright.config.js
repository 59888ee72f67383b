/**
 * Galata tests of the Cluster panel. tests/browser/test_lab_panel_ui.py starts JupyterLab
 * (with the galata helper extension and expose_app_in_browser) and a cluster, then
 * runs `npx playwright test` with:
 *   PDL_LAB_URL      the server's URL
 *   PDL_LAB_TOKEN    its token (sent as an Authorization header)
 *   PDL_ENGINES      how many engines the panel should list
 *   PDL_SCREENSHOTS  where to save screenshots (optional)
 *   PDL_CHROMIUM     the browser (default /usr/bin/chromium: Playwright cannot download one here)
 */
const baseConfig = require('@jupyterlab/galata/lib/playwright-config');

module.exports = {
  ...baseConfig,
  reporter: [['list']],
  retries: 0,
  workers: 1,
  outputDir: process.env.PDL_TEST_OUTPUT || 'test-results',
  use: {
    ...baseConfig.use,
    baseURL: process.env.PDL_LAB_URL || 'http://127.0.0.1:8888',
    extraHTTPHeaders: process.env.PDL_LAB_TOKEN
      ? { Authorization: `token ${process.env.PDL_LAB_TOKEN}` }
      : {},
    viewport: { width: 1280, height: 800 },
    trace: 'off',
    video: 'off',
    launchOptions: {
      executablePath: process.env.PDL_CHROMIUM || '/usr/bin/chromium',
      args: [
        '--headless',
        '--no-sandbox',
        '--disable-gpu',
        '--disable-quic',
        '--no-first-run',
        '--disable-background-networking',
        '--disable-component-update',
        '--disable-sync'
      ]
    }
  }
};
