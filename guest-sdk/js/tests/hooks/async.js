// An async hook that awaits its own promises before it answers.
async function desiredStatus(parent) {
  let phase = await Promise.resolve(parent.spec.replicas > 0 ? 'Running' : 'Idle');
  return new Promise(function (resolve) {
    resolve({ phase: phase, path: 'awaited' });
  });
}

module.exports = async function (context) {
  let status = await desiredStatus(context.request.body.parent);
  return { status: 200, body: { status: status, children: [] } };
};
