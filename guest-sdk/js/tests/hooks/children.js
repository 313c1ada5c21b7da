// A sync hook in fission's style: one ConfigMap per replica of the parent, the status counts the
// observed ones. Its helpers are plain functions beside the hook, as in Metacontroller's examples.
var configMap = function (parent, index) {
  return {
    apiVersion: 'v1',
    kind: 'ConfigMap',
    metadata: { name: `${parent.metadata.name}-${index}`, labels: { app: parent.metadata.name } },
    data: { message: parent.spec.message, index: String(index) },
  };
};

module.exports = async function (context) {
  let observed = context.request.body;
  let parent = observed.parent;
  let children = [];
  for (let i = 0; i < parent.spec.replicas; i++) children.push(configMap(parent, i));
  let seen = Object.keys(observed.children['ConfigMap.v1'] || {}).length;
  console.log('sync', parent.metadata.name, { replicas: parent.spec.replicas, seen: seen });
  return {
    status: 200,
    body: { status: { configMaps: seen }, children: children },
    headers: { 'Content-Type': 'application/json' },
  };
};
