/**
 * pdl-cluster: the "Cluster" panel in JupyterLab's left sidebar.
 *
 * Settings (schema/plugin.json): refreshInterval, the poll period in ms.
 * Command: pdl-cluster:open shows the panel.
 */
import {
  ILayoutRestorer,
  JupyterFrontEnd,
  JupyterFrontEndPlugin
} from '@jupyterlab/application';
import { ICommandPalette } from '@jupyterlab/apputils';
import { ISettingRegistry } from '@jupyterlab/settingregistry';
import { LabIcon } from '@jupyterlab/ui-components';

import { ClusterPanel, DEFAULT_REFRESH_MS } from './panel';

const PLUGIN_ID = 'pdl-cluster:plugin';
const OPEN_COMMAND = 'pdl-cluster:open';

const CLUSTER_SVG = `<svg xmlns="http://www.w3.org/2000/svg" width="16" height="16" viewBox="0 0 24 24">
  <g class="jp-icon3" fill="#616161">
    <rect x="2" y="3" width="9" height="7" rx="1"/><rect x="13" y="3" width="9" height="7" rx="1"/>
    <rect x="2" y="14" width="9" height="7" rx="1"/><rect x="13" y="14" width="9" height="7" rx="1"/>
  </g>
</svg>`;

export const clusterIcon = new LabIcon({ name: 'pdl-cluster:cluster', svgstr: CLUSTER_SVG });

const plugin: JupyterFrontEndPlugin<void> = {
  id: PLUGIN_ID,
  description: "PDL's Cluster panel: engines, their load, and the running %%distributed cell.",
  autoStart: true,
  optional: [ISettingRegistry, ILayoutRestorer, ICommandPalette],
  activate: (
    app: JupyterFrontEnd,
    settingRegistry: ISettingRegistry | null,
    restorer: ILayoutRestorer | null,
    palette: ICommandPalette | null
  ) => {
    const panel = new ClusterPanel();
    panel.title.icon = clusterIcon;
    app.shell.add(panel, 'left', { rank: 650 });
    if (restorer) {
      restorer.add(panel, panel.id);
    }

    app.commands.addCommand(OPEN_COMMAND, {
      label: 'Show the Cluster panel',
      execute: () => app.shell.activateById(panel.id)
    });
    if (palette) {
      palette.addItem({ command: OPEN_COMMAND, category: 'PDL' });
    }

    if (settingRegistry) {
      settingRegistry
        .load(PLUGIN_ID)
        .then(settings => {
          const apply = () => {
            panel.refreshMs = (settings.get('refreshInterval').composite as number) ?? DEFAULT_REFRESH_MS;
          };
          apply();
          settings.changed.connect(apply);
        })
        .catch(reason => console.error('pdl-cluster: cannot load settings', reason));
    }
  }
};

export default plugin;
