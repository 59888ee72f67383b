import { expect, galata, test } from '@jupyterlab/galata';
import * as path from 'path';

const ENGINES = Number(process.env.PDL_ENGINES || 2);
const PANEL = '#pdl-cluster-panel';

// Keep the panel's own settings (galata mocks the settings of every other plugin).
test.use({ mockSettings: { ...galata.DEFAULT_SETTINGS } });

test.describe('Cluster panel', () => {
  test('lists every engine idle with its slot and load', async ({ page }) => {
    await page.sidebar.openTab('pdl-cluster-panel');
    const panel = page.locator(PANEL);
    await expect(panel).toBeVisible();
    const idle = panel.locator('.pdl-engine[data-state="idle"]');
    await expect(idle).toHaveCount(ENGINES, { timeout: 60000 });
    await expect(panel.locator('.pdl-slots')).toContainText(`Reserved: ${ENGINES} slots`);
    await expect(panel.locator('.pdl-nodes')).toContainText('Node');
    await expect(idle.first().locator('.pdl-cpu')).toContainText(/CPU \d+%/);
    await expect(idle.first().locator('.pdl-ram')).toContainText(/RAM [\d.]+ (MiB|GiB)/);
    // nothing runs: Stop is disabled, Restart is offered
    await expect(panel.locator('button.pdl-stop')).toBeDisabled();
    await expect(panel.locator('button.pdl-restart')).toBeEnabled();
    if (process.env.PDL_SCREENSHOTS) {
      await panel.screenshot({ path: path.join(process.env.PDL_SCREENSHOTS, 'panel-galata.png') });
    }
  });

  test('Restart engines asks first, and Cancel leaves the engines alone', async ({ page }) => {
    await page.sidebar.openTab('pdl-cluster-panel');
    const panel = page.locator(PANEL);
    // each engine idle and described (its load shown), so the rows are in their final order
    await expect(panel.locator('.pdl-engine[data-state="idle"] .pdl-cpu')).toHaveCount(ENGINES, { timeout: 60000 });
    const ids = await panel.locator('.pdl-engine').evaluateAll(els => els.map(e => e.getAttribute('data-engine-id')));
    await panel.locator('button.pdl-restart').click();
    const dialog = page.locator('.jp-Dialog');
    await expect(dialog).toContainText('Restart engines?');
    await dialog.locator('button', { hasText: 'Cancel' }).click();
    await expect(dialog).toHaveCount(0);
    await page.waitForTimeout(2000);
    const after = await panel.locator('.pdl-engine[data-state="idle"]').evaluateAll(els =>
      els.map(e => e.getAttribute('data-engine-id'))
    );
    expect(after).toEqual(ids);
  });

  test('the refresh interval is a setting', async ({ page }) => {
    const settings = await page.evaluate(async () => {
      const app = (window as any).jupyterapp;
      const s = await app.serviceManager.settings.fetch('pdl-cluster:plugin');
      return s.schema.properties.refreshInterval;
    });
    expect(settings.default).toBe(1000);
    expect(settings.minimum).toBe(250);
  });
});
