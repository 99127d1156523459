// panva/oidc-provider as keyturn's tests run it, plus a small resource server that accepts only
// a token it can verify (signature, issuer, `aud`, and for a certificate-bound token the client
// certificate of the connection, RFC 8705 §3). Started by keyturn_devkit.dev.oidc_provider,
// which writes the JSON configuration named by argv[2]:
//
//   { "port": 0, "resource_port": 0, "issuer": null,
//     "tls": { "cert": "server.pem", "key": "server.key", "ca": "ca.pem" } | null,
//     "clients": [ <RFC 7591 client metadata> ], "access_token_ttl": 60,
//     "refresh_token_ttl": 86400, "resources": { "<indicator>": { "scope": "read", "ttl": 60 } },
//     "default_resource": "<indicator>", "registration": { "initial_access_token": "…" } | null,
//     "clock_tolerance": 5, "ready_file": "ready.json",
//     "service_accounts": { "<email>": <JWKS of its public keys> } }
//
// Once both servers listen it writes {"issuer", "resource_url"} to `ready_file` (JSON).
// Loopback only; throwaway keys; never for anything but a test.
import * as crypto from 'node:crypto';
import { readFileSync, renameSync, writeFileSync } from 'node:fs';
import * as http from 'node:http';
import * as https from 'node:https';

import * as jose from 'jose';
import Provider from 'oidc-provider';

const config = JSON.parse(readFileSync(process.argv[2], 'utf8'));
const HOST = '127.0.0.1';
const tls = config.tls
  ? {
    cert: readFileSync(config.tls.cert),
    key: readFileSync(config.tls.key),
    ca: config.tls.ca ? readFileSync(config.tls.ca) : undefined,
    // Every client certificate is asked for and none refused at the handshake: the provider
    // judges it (self-signed ones are registered by thumbprint, CA-issued ones by subject).
    requestCert: true,
    rejectUnauthorized: false,
  }
  : null;

function listen(handler, port) {
  const server = tls ? https.createServer(tls, handler) : http.createServer(handler);
  return new Promise((resolve) => { server.listen(port, HOST, () => resolve(server)); });
}

function peerCertificate(socket) {
  if (typeof socket.getPeerX509Certificate !== 'function') return undefined;
  return socket.getPeerX509Certificate() || undefined;
}

const signing = await jose.generateKeyPair('RS256', { extractable: true });
const privateJwk = { ...(await jose.exportJWK(signing.privateKey)), kid: 'server-1', alg: 'RS256', use: 'sig' };
const publicJwks = { keys: [{ ...(await jose.exportJWK(signing.publicKey)), kid: 'server-1', alg: 'RS256', use: 'sig' }] };

// Bind first, so that the issuer can name the port the OS chose.
const resourceServer = await listen(undefined, config.resource_port || 0);
const providerServer = await listen(undefined, config.port || 0);
const scheme = tls ? 'https' : 'http';
const issuer = config.issuer || `${scheme}://${HOST}:${providerServer.address().port}`;
const resourceUrl = `${scheme}://${HOST}:${resourceServer.address().port}`;
const resources = config.resources || {};

const provider = new Provider(issuer, {
  clients: config.clients || [],
  jwks: { keys: [privateJwk] },
  clockTolerance: config.clock_tolerance ?? 5,
  // The provider refuses to fetch from special-use addresses (SSRF protection); here every
  // jwks_uri is a test's server on loopback, so its dispatcher is left out.
  fetch(url, options) {
    const { dispatcher: _ssrfGuard, ...rest } = options;
    return globalThis.fetch(url, rest);
  },
  clientAuthMethods: [
    'client_secret_basic', 'client_secret_post', 'private_key_jwt',
    ...(tls ? ['tls_client_auth', 'self_signed_tls_client_auth'] : []),
  ],
  ttl: {
    ClientCredentials: config.access_token_ttl ?? 60,
    AccessToken: config.access_token_ttl ?? 60,
    RefreshToken: config.refresh_token_ttl ?? 86400,
  },
  rotateRefreshToken: true,
  async findAccount(_ctx, sub) {
    return { accountId: sub, async claims() { return { sub }; } };
  },
  features: {
    devInteractions: { enabled: false },
    clientCredentials: { enabled: true },
    introspection: { enabled: true },
    revocation: { enabled: true },
    registration: config.registration
      ? { enabled: true, initialAccessToken: config.registration.initial_access_token || false }
      : { enabled: false },
    registrationManagement: config.registration
      ? { enabled: true, rotateRegistrationAccessToken: true }
      : { enabled: false },
    mTLS: {
      enabled: Boolean(tls),
      certificateBoundAccessTokens: Boolean(tls),
      selfSignedTlsClientAuth: Boolean(tls),
      tlsClientAuth: Boolean(tls),
      getCertificate(ctx) { return peerCertificate(ctx.socket); },
      certificateAuthorized(ctx) { return ctx.socket.authorized === true; },
      certificateSubjectMatches(ctx, property, expected) {
        const cert = peerCertificate(ctx.socket);
        if (property === 'tls_client_auth_subject_dn') {
          return cert.subject.split('\n').reverse().join(',') === expected || cert.subject === expected;
        }
        if (property === 'tls_client_auth_san_dns') {
          return (cert.subjectAltName || '').split(', ').includes(`DNS:${expected}`);
        }
        return false;
      },
    },
    resourceIndicators: {
      enabled: true,
      defaultResource(_ctx, _client, oneOf) { return oneOf || config.default_resource; },
      useGrantedResource() { return true; },
      getResourceServerInfo(_ctx, indicator) {
        const known = resources[indicator];
        if (!known) throw new Provider.errors.InvalidTarget(`unknown resource ${indicator}`);
        return {
          scope: known.scope || 'read',
          audience: indicator,
          accessTokenTTL: known.ttl ?? config.access_token_ttl ?? 60,
          accessTokenFormat: 'jwt',
          jwt: { sign: { alg: 'RS256' } },
        };
      },
    },
  },
});
provider.proxy = false;
// Why a request was refused, in the log (the answer itself says only invalid_client).
for (const event of ['grant.error', 'server_error', 'revocation.error', 'registration_update.error']) {
  provider.on(event, (_ctx, error) => {
    const inner = error.cause?.cause ? `: ${error.cause.cause.message}` : "";
    const cause = error.cause ? ` (${error.cause.error_description || error.cause.message}${inner})` : "";
    console.error(`${event}: ${error.error || error.name}: ${error.error_detail || error.error_description || error.message}${cause}`);
  });
}
// Which key signed each client assertion the token endpoint judged, and when (ms since the
// epoch), one JSON line each: a test compares it with what the client's jwks_uri served
// (keyturn_devkit.dev.oidc_provider.OidcProvider.client_assertions).
for (const [event, outcome] of [['grant.success', 'accepted'], ['grant.error', 'refused']]) {
  provider.on(event, (ctx) => {
    const assertion = ctx.oidc?.params?.client_assertion;
    if (!assertion) return;
    let kid;
    try { ({ kid } = jose.decodeProtectedHeader(assertion)); } catch { kid = null; }
    const client = ctx.oidc.client?.clientId ?? ctx.oidc.params.client_id ?? null;
    console.error(`client_assertion: ${JSON.stringify({ outcome, client, kid, at: Date.now() })}`);
  });
}

// A refresh token for a client, as if a person had consented: the tests' stand-in for an
// authorization-code flow (POST /__dev/refresh-token {client_id, scope, resource}).
async function seedRefreshToken(body) {
  const client = await provider.Client.find(body.client_id);
  if (!client) return [404, { error: 'unknown client' }];
  const grant = new provider.Grant({ accountId: 'alice', clientId: client.clientId });
  grant.addOIDCScope('openid offline_access');
  if (body.resource) grant.addResourceScope(body.resource, body.scope || 'read');
  const grantId = await grant.save();
  const token = new provider.RefreshToken({
    accountId: 'alice',
    client,
    grantId,
    gty: 'authorization_code',
    scope: 'openid offline_access',
    resource: body.resource,
  });
  return [200, { refresh_token: await token.save() }];
}

// The JWT bearer grant as Google's token endpoint runs it (RFC 7523 §2.1, no client
// authentication): POST /__google/token with grant_type and assertion; the assertion is
// signed by a configured service account's key (`iss` its email), `aud` this URL, at most an
// hour long; the token is a JWT the resource server accepts. oidc-provider has no such grant:
// this route is the harness's own, small, and says so in docs/providers.md.
const googleTokenUrl = `${issuer}/__google/token`;
const serviceAccounts = Object.fromEntries(Object.entries(config.service_accounts || {})
  .map(([email, jwks]) => [email, jose.createLocalJWKSet(jwks)]));
async function googleToken(form) {
  const refuse = (description) => [400, { error: 'invalid_grant', error_description: description }];
  if (form.get('grant_type') !== 'urn:ietf:params:oauth:grant-type:jwt-bearer') {
    return [400, { error: 'unsupported_grant_type' }];
  }
  const assertion = form.get('assertion') || '';
  let claims;
  try {
    claims = jose.decodeJwt(assertion);
  } catch { return refuse('assertion is not a JWT'); }
  const keys = serviceAccounts[claims.iss];
  if (!keys) return refuse('Invalid JWT Signature.');
  try {
    await jose.jwtVerify(assertion, keys, {
      audience: googleTokenUrl, clockTolerance: config.clock_tolerance ?? 5, maxTokenAge: '3600s',
    });
  } catch (error) { return refuse(`${error.code}: ${error.message}`); }
  const ttl = config.access_token_ttl ?? 60;
  const token = await new jose.SignJWT({ client_id: claims.iss, scope: claims.scope })
    .setProtectedHeader({ alg: 'RS256', kid: 'server-1', typ: 'at+jwt' })
    .setIssuer(issuer).setAudience(config.default_resource).setSubject(claims.sub || claims.iss)
    .setIssuedAt().setExpirationTime(`${ttl}s`).setJti(crypto.randomUUID())
    .sign(signing.privateKey);
  return [200, { access_token: token, token_type: 'Bearer', expires_in: ttl }];
}

// Each request to a client's registration URI (RFC 7592, /reg/<client_id>): its method, path
// and the sha256 (hex) of the Bearer token presented, never the token; the tests count
// presentations per token (GET /__dev/registration-presentations).
const presentations = [];
function notePresentation(req) {
  const path = req.url.split('?')[0];
  const bearer = /^Bearer (.+)$/.exec(req.headers.authorization || '');
  if (!path.startsWith('/reg/') || !bearer) return;
  const sha256 = crypto.createHash('sha256').update(bearer[1]).digest('hex');
  presentations.push({ method: req.method, path, sha256 });
}

const callback = provider.callback();
providerServer.on('request', async (req, res) => {
  notePresentation(req);
  if (req.method === 'GET' && req.url === '/__dev/registration-presentations') {
    res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify(presentations));
    return;
  }
  if (req.method === 'POST' && req.url === '/__dev/refresh-token') {
    let data = '';
    for await (const chunk of req) data += chunk;
    const [status, answer] = await seedRefreshToken(JSON.parse(data));
    res.writeHead(status, { 'content-type': 'application/json' }).end(JSON.stringify(answer));
    return;
  }
  if (req.method === 'POST' && req.url === '/__google/token') {
    let data = '';
    for await (const chunk of req) data += chunk;
    const [status, answer] = await googleToken(new URLSearchParams(data));
    res.writeHead(status, { 'content-type': 'application/json', 'cache-control': 'no-store' })
      .end(JSON.stringify(answer));
    return;
  }
  callback(req, res);
});

const keySet = jose.createLocalJWKSet(publicJwks);
function refuse(res, status, description) {
  res.writeHead(status, {
    'content-type': 'application/json',
    'www-authenticate': `Bearer error="invalid_token", error_description="${description}"`,
  }).end(JSON.stringify({ error: 'invalid_token', error_description: description }));
}
resourceServer.on('request', async (req, res) => {
  const audience = new URL(req.url, resourceUrl).searchParams.get('aud')
    || config.default_resource;
  const match = /^Bearer (.+)$/.exec(req.headers.authorization || '');
  if (!match) return refuse(res, 401, 'no bearer token');
  let payload;
  try {
    ({ payload } = await jose.jwtVerify(match[1], keySet, { issuer, audience, typ: 'at+jwt' }));
  } catch (error) {
    return refuse(res, 401, `${error.code}: ${error.message}`);
  }
  const bound = payload.cnf && payload.cnf['x5t#S256'];
  if (bound) {
    const cert = peerCertificate(req.socket);
    const presented = cert && crypto.createHash('sha256').update(cert.raw).digest('base64url');
    if (presented !== bound) return refuse(res, 401, 'certificate-bound token without its certificate');
  }
  res.writeHead(200, { 'content-type': 'application/json' })
    .end(JSON.stringify({ client_id: payload.client_id, aud: payload.aud, scope: payload.scope }));
  return undefined;
});

process.on('SIGTERM', () => { providerServer.close(); resourceServer.close(); process.exit(0); });
writeFileSync(`${config.ready_file}.tmp`, JSON.stringify({ issuer, resource_url: resourceUrl }));
renameSync(`${config.ready_file}.tmp`, config.ready_file);
