"""PDL's IPython kernel defaults, installed as <prefix>/etc/ipython/ipython_kernel_config.py.

Every kernel loads :mod:`pdl_lab.kernel_ends`: where Jupyter restarted a kernel that the
user's memory limit ended, the new kernel's first cell says so in one line.
"""

c = get_config()  # noqa: F821 - defined by the config loader

c.InteractiveShellApp.extensions.append("pdl_lab.kernel_ends")
