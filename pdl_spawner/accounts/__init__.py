"""Who may log in to the hub, and the Unix account each user runs as.

- :mod:`pdl_spawner.accounts.authenticator`: each user's own login
  (jupyterhub-nativeauthenticator, with PDL's limits), with its pages
  (:mod:`pdl_spawner.accounts.pages`); :mod:`pdl_spawner.accounts.login_guard`: PDL's
  hardening of a password login (lockout, one check at a time, a bounded pool), which
  any password login of PDL's uses; :mod:`pdl_spawner.accounts.form_limits`: the most
  characters each field of the login and sign-up forms takes.
- :mod:`pdl_spawner.accounts.credentials`: the admin's first password and the signup codes.
- :mod:`pdl_spawner.accounts.lab_logins`: logins with the lab's own accounts through
  JupyterHub's authenticators (PAM, LDAP, OpenID Connect), with the guard's hardening
  where the hub checks a password.
- :mod:`pdl_spawner.accounts.unix_accounts`: one Unix account per hub user (as root), or
  the lab's own account of the same name (``lab_account``).
"""
