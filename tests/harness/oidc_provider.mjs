// A real OpenID Connect provider for the tests (npm's certified `oidc-provider`), on
// http://127.0.0.1:<port>, with a login form of its own instead of the library's
// development interactions. Started by tests/harness/oidc_provider.py.
//
// Usage: node oidc_provider.mjs CONFIG.json   (NODE_PATH: the node_modules holding oidc-provider)
// CONFIG: {"port": N,
//          "clients": [{"client_id", "client_secret", "redirect_uris": [...]}],
//          "accounts": {"<login>": {"password", "claims": {"sub", "preferred_username", "email", "groups", ...}}},
//          "cookie_keys": ["<secret>", ...]}            (optional; random ones otherwise)
// Contract: the issuer is exactly http://127.0.0.1:<port>; one line `ready <issuer>` goes
// to stdout once it listens; SIGTERM ends it with status 0. Everything is in memory.
//
// Login: the interaction page /interaction/<uid> is a form with fields `login` and
// `password` posted back to the same URL. A wrong pair shows the form again with the line
// "wrong login or password". Consent is granted at once for whatever the client asked
// (scopes openid, profile, email, groups; the claim `groups` comes with profile or groups).

import { generateKeyPairSync, randomBytes } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { createServer } from 'node:http';
import { createRequire } from 'node:module';
import { pathToFileURL } from 'node:url';

// ES modules ignore NODE_PATH: resolve the package through it as CommonJS would, then import.
const require = createRequire(pathToFileURL(`${process.cwd()}/`));
const { Provider } = await import(pathToFileURL(require.resolve('oidc-provider')).href);

const config = JSON.parse(readFileSync(process.argv[2], 'utf8'));
const issuer = `http://127.0.0.1:${config.port}`;
const accounts = config.accounts ?? {};
const accountsBySub = new Map(
  Object.entries(accounts).map(([login, account]) => [subjectOf(login, account), account]),
);

/** The account's subject (`sub`): its claim `sub`, or else its login name. */
function subjectOf(login, account) {
  return String(account.claims?.sub ?? login);
}

/** The escaped text for an HTML attribute or element. */
function htmlEscape(text) {
  return String(text).replace(/[&<>"']/g, (c) => `&#${c.charCodeAt(0)};`);
}

/** The login page: the form, with `error` as one line above it when given. */
function loginPage(uid, login = '', error = '') {
  return `<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>Sign in</title></head>
<body>
<h1>Sign in</h1>
${error ? `<p id="error" class="error">${htmlEscape(error)}</p>` : ''}
<form method="post" action="/interaction/${htmlEscape(uid)}">
  <label>Login <input id="login" name="login" value="${htmlEscape(login)}" autofocus></label>
  <label>Password <input id="password" name="password" type="password"></label>
  <button id="submit" type="submit">Sign in</button>
</form>
</body></html>
`;
}

/** The form fields of a urlencoded request body. */
async function formFields(req) {
  const chunks = [];
  for await (const chunk of req) chunks.push(chunk);
  return new URLSearchParams(Buffer.concat(chunks).toString('utf8'));
}

function send(res, status, contentType, body) {
  res.writeHead(status, { 'Content-Type': contentType, 'Cache-Control': 'no-store' });
  res.end(body);
}

const signingKey = generateKeyPairSync('rsa', { modulusLength: 2048 }).privateKey;

const provider = new Provider(issuer, {
  clients: (config.clients ?? []).map((client) => ({
    client_id: client.client_id,
    client_secret: client.client_secret,
    redirect_uris: client.redirect_uris,
    grant_types: ['authorization_code'],
    response_types: ['code'],
    // client_secret_post is accepted as well: the library treats the two as one.
    token_endpoint_auth_method: 'client_secret_basic',
  })),
  jwks: { keys: [{ ...signingKey.export({ format: 'jwk' }), kid: 'test-rs256', use: 'sig', alg: 'RS256' }] },
  // cookies are Secure only when the request came over https: on http they are not
  cookies: {
    keys: config.cookie_keys?.length ? config.cookie_keys : [randomBytes(32).toString('hex')],
    long: { signed: true, httpOnly: true, sameSite: 'lax' },
    short: { signed: true, httpOnly: true, sameSite: 'lax' },
  },
  claims: {
    openid: ['sub'],
    profile: ['name', 'given_name', 'family_name', 'nickname', 'preferred_username', 'picture',
      'locale', 'updated_at', 'groups'],
    email: ['email', 'email_verified'],
    groups: ['groups'],
  },
  // the ID token carries the granted claims too, not only the userinfo answer
  conformIdTokenClaims: false,
  features: { devInteractions: { enabled: false } },
  interactions: { url: (ctx, interaction) => `/interaction/${interaction.uid}` },
  async findAccount(ctx, sub) {
    const account = accountsBySub.get(sub);
    if (!account) return undefined;
    return { accountId: sub, claims: async () => ({ ...account.claims, sub }) };
  },
});
provider.on('server_error', (ctx, error) => console.error('server_error', error));

/** Grant at once what the pending consent prompt asks for; the interaction's result. */
async function grantConsent(interaction) {
  const { prompt: { details }, params, session } = interaction;
  const grant = interaction.grantId
    ? await provider.Grant.find(interaction.grantId)
    : new provider.Grant({ accountId: session.accountId, clientId: params.client_id });
  if (details.missingOIDCScope) grant.addOIDCScope(details.missingOIDCScope.join(' '));
  if (details.missingOIDCClaims) grant.addOIDCClaims(details.missingOIDCClaims);
  for (const [indicator, scopes] of Object.entries(details.missingResourceScopes ?? {})) {
    grant.addResourceScope(indicator, scopes.join(' '));
  }
  return { consent: { grantId: await grant.save() } };
}

/** GET shows the login form (or grants consent); POST checks the login. */
async function handleInteraction(req, res, uid) {
  let interaction;
  try {
    interaction = await provider.interactionDetails(req, res);
  } catch (error) {
    send(res, 400, 'text/plain; charset=utf-8', `no such login in progress: ${error.message}\n`);
    return;
  }
  if (interaction.uid !== uid) {
    send(res, 400, 'text/plain; charset=utf-8', 'this login belongs to another page\n');
    return;
  }
  if (interaction.prompt.name === 'consent') {
    await provider.interactionFinished(req, res, await grantConsent(interaction),
      { mergeWithLastSubmission: true });
    return;
  }
  if (req.method !== 'POST') {
    send(res, 200, 'text/html; charset=utf-8', loginPage(uid));
    return;
  }
  const fields = await formFields(req);
  const login = fields.get('login') ?? '';
  const account = Object.hasOwn(accounts, login) ? accounts[login] : undefined;
  if (!account || account.password !== (fields.get('password') ?? '')) {
    send(res, 200, 'text/html; charset=utf-8', loginPage(uid, login, 'wrong login or password'));
    return;
  }
  await provider.interactionFinished(req, res, { login: { accountId: subjectOf(login, account) } },
    { mergeWithLastSubmission: false });
}

const providerCallback = provider.callback();
const server = createServer((req, res) => {
  const match = /^\/interaction\/([^/?]+)(?:\?.*)?$/.exec(req.url);
  if (!match || !['GET', 'POST'].includes(req.method)) {
    providerCallback(req, res);
    return;
  }
  handleInteraction(req, res, match[1]).catch((error) => {
    console.error('interaction failed', error);
    if (!res.headersSent) send(res, 500, 'text/plain; charset=utf-8', `interaction failed: ${error.message}\n`);
  });
});

server.listen(config.port, '127.0.0.1', () => console.log(`ready ${issuer}`));
process.on('SIGTERM', () => {
  server.close();
  process.exit(0);
});
