// A fission-style hook for the component test (tests/hook-component.test.js): built once, it
// answers by the parent's `spec.mode`, so one build covers every way a hook can answer.
var children = function (parent) {
  var out = [];
  for (var i = 0; i < parent.spec.replicas; i++) {
    out.push({ apiVersion: 'v1', kind: 'ConfigMap', metadata: { name: parent.metadata.name + '-' + i }, data: { i: String(i) } });
  }
  return out;
};

var later = function (value) {
  return new Promise(function (resolve) {
    Promise.resolve().then(function () {
      resolve(value);
    });
  });
};

module.exports = async function (context) {
  var request = context.request;
  var parent = request.body.parent;
  switch (parent.spec.mode) {
    case 'fail':
      return { status: 503, body: { reason: 'busy' } };
    case 'throw':
      throw new RangeError('replicas out of range: ' + parent.spec.replicas);
    case 'text':
      return { status: 200, body: '{"children":[]}' };
    case 'require':
      require('https');
      break;
    case 'chatty':
      for (var i = 0; i < 300; i++) console.log('line', i);
      break;
    case 'huge':
      return { status: 200, body: { blob: 'x'.repeat(5 << 20) } };
    default:
      break;
  }
  console.log('hook', request.method, request.path, 'for', parent.metadata.name);
  var seen = await later(Object.keys(request.body.children['ConfigMap.v1'] || {}).length);
  return {
    status: 200,
    body: { status: { seen: seen, path: request.url, finalizing: Boolean(request.body.finalizing) }, children: children(parent) },
    headers: { 'Content-Type': 'application/json' },
  };
};
